"""TRITON_ATTN: attention on Triton kernels (vllm/attention/ops/triton_*.py).

Two kernels per layer: the KV write (`write_kv`, the step's new keys and values into their
cache slots, in place of the layer's `index_copy_`) and one varlen attention launch over the
whole flat batch. Cache readers' keys are read in place through their block tables (no
gather into a packed tensor, unlike FLASH_ATTN); sliding windows and logit softcapping run
inside the kernel (`handles_window_softcap`: the layer does not send those steps to
backends/masked.py). The pooler also finds its reductions here (`pool_rows`: LAST / CLS /
MEAN over the flat batch and L2 normalize, ops/triton_pooling.py). float32, float16 and
bfloat16; any head size up to 256 (a power-of-two tile with a mask).

On a GPU the kernels are compiled; on the CPU they run only in Triton's interpreter
(TRITON_INTERPRET=1, which `@triton.jit` reads when the kernel module is imported): the
platforms refuse TRITON_ATTN otherwise. The kernel modules are imported on first use, never
when this module is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from vllm.attention.backends.abstract import AttentionBackend
from vllm.attention.metadata import AttentionMetadata

MAX_HEAD_SIZE = 256
_BIG = 1 << 30   # a window side past every position (kept in int32 range)


@dataclass
class TritonMetadata:
    q_start: torch.Tensor       # int32 [B] flat row of each request's first new token
    num_cached: torch.Tensor    # int32 [B] k
    num_new: torch.Tensor       # int32 [B] n
    tile_req: torch.Tensor      # int32 [tiles] each program's request
    tile_start: torch.Tensor    # int32 [tiles] its first new-token row within the request
    block_tables: torch.Tensor  # int32 [max(r, 1), W] the cache readers' blocks holding k
    block_m: int                # query rows per program
    block_n: int                # keys per iteration
    num_readers: int


def tile_sizes(device: torch.device) -> tuple[int, int]:
    """(query rows per program, keys per iteration): 64 x 64 on a GPU (tensor-core tiles;
    tl.dot wants both >= 16); 16 x 16 in the interpreter, where padded rows cost as much as
    real ones."""
    return (16, 16) if device.type == "cpu" else (64, 64)


def build_triton_metadata(meta: AttentionMetadata, block_m: int,
                          block_n: int) -> TritonMetadata:
    """Every per-step index the kernels read, packed in one int32 tensor and moved to the
    device in one copy."""
    b, r, bs = meta.num_reqs, meta.num_readers, meta.block_size
    new = torch.tensor(meta.num_new, dtype=torch.int32)
    tiles = (new + block_m - 1) // block_m
    tile_req = torch.repeat_interleave(torch.arange(b, dtype=torch.int32), tiles)
    first = torch.cumsum(tiles, 0) - tiles                      # each request's first tile
    tile_start = (torch.arange(len(tile_req), dtype=torch.int32) - first[tile_req]) * block_m
    width = max([-(-meta.num_computed[i] // bs) for i in range(r)], default=1)
    table = torch.zeros(max(r, 1), width, dtype=torch.int32)
    for i in range(r):   # only the blocks holding a reader's k cached tokens are read
        row = meta.block_tables[i][:-(-meta.num_computed[i] // bs)]
        table[i, :len(row)] = torch.tensor(row, dtype=torch.int32)
    parts = [torch.tensor(meta.query_start_loc[:b], dtype=torch.int32),
             torch.tensor(meta.num_computed, dtype=torch.int32), new, tile_req,
             tile_start.to(torch.int32), table.flatten()]
    flat = torch.cat(parts).to(meta.device)
    q_start, cached, num_new, t_req, t_start, tab = torch.split(flat, [len(p) for p in parts])
    return TritonMetadata(q_start, cached, num_new, t_req, t_start, tab.view(table.shape),
                          block_m, block_n, r)


class TritonAttentionBackend(AttentionBackend):
    name = "TRITON_ATTN"
    # Hooks the layer looks for (vllm/model_executor/layers/attention.py): this backend
    # writes the KV cache itself and applies windows and softcaps in its kernel.
    handles_window_softcap = True

    def pool_rows(self, x: torch.Tensor, starts: list[int], counts: list[int],
                  norm_dims: Optional[list[int]] = None) -> torch.Tensor:
        """The pooler's hook: float32 [N, H], row i the mean of x's rows starts[i] ..
        starts[i] + counts[i] - 1 (then L2-normalized over its first norm_dims[i] values
        where that is > 0). The index lists reach the device in one copy."""
        from vllm.attention.ops import triton_pooling
        lists = [starts, counts] + ([norm_dims] if norm_dims is not None else [])
        index = torch.tensor(lists, dtype=torch.int32).to(x.device)
        return triton_pooling.pool_rows(x, index[0], index[1],
                                        index[2] if norm_dims is not None else None)

    def build(self, meta: AttentionMetadata) -> TritonMetadata:
        return build_triton_metadata(meta, *tile_sizes(meta.device))

    def write_kv(self, layer: Any, k: torch.Tensor, v: torch.Tensor,
                 meta: AttentionMetadata) -> None:
        """The step's new K/V into `layer.kv_cache` at `meta.slot_mapping` (one launch)."""
        from vllm.attention.ops import triton_kv_cache
        triton_kv_cache.write_kv(k, v, layer.kv_cache, meta.slot_mapping)

    def forward(self, layer: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        from vllm.attention.ops import triton_attention
        data: TritonMetadata = meta.prepared(self)
        window = getattr(layer, "window", None)
        if window is not None:
            window = (min(window[0], _BIG), min(window[1], _BIG))
        return triton_attention.varlen_attention(
            q, k, v, layer.kv_cache if data.num_readers else None, data.block_tables,
            data.tile_req, data.tile_start, data.q_start, data.num_cached, data.num_new,
            scale=layer.scale, causal=meta.causal, block_size=meta.block_size,
            block_m=data.block_m, block_n=data.block_n, window=window,
            softcap=getattr(layer, "softcap", None))
