"""CPU_NATIVE: the C++ packed-sequence kernel (csrc/varlen_attention.cpp) for every request.

Two kernel calls per layer: one for the requests that read no cache (laid out last, keys
are their own new rows), one for the cache readers (laid out first), whose keys it reads
from the cache slots directly, tile by tile; tiles of keys shared by several readers (a
common prefix) carry one id, so the kernel reuses their work. A bfloat16 model runs the
bfloat16 kernel (csrc/varlen_attention_bf16.cpp: Q*K^T on vdpbf16ps, softmax and P*V in
float32) where the CPU and build have AVX512-BF16, on q/k/v and its bfloat16 cache as they
are; elsewhere the float32 kernel on float32 copies of the new rows, and a bfloat16 cache,
which that kernel cannot read, sends the readers to TORCH_SDPA's path. A float32 model
whose layers say so (`layer.bf16_ok`: int8 models where the CPU has AVX512-BF16, set by
`bind_ops`) runs the bfloat16 kernel on its float32 q/k/v (rounded where the kernel copies
them; `layer.bf16_pv`: V and the weights too), float32 out, and its float32 cache's readers
on the same kernel, so a cache hit repeats the first answer.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from vllm.attention.backends.torch_sdpa import TorchSdpaBackend
from vllm.attention.metadata import AttentionMetadata, reader_key_slots
from vllm._kernels.cpu_kernels import varlen_attention_bf16_kernel, varlen_attention_kernel

# Keys per tile of the C++ attention kernel (csrc/varlen_attention.cpp, BK).
KERNEL_TILE = 64
_NONE = torch.empty(0, dtype=torch.long)  # an absent optional index for the kernel


@dataclass
class CpuNativeMetadata:
    meta: AttentionMetadata
    packed_start: int             # flat row of the first request that reads no cache
    packed_offsets: torch.Tensor  # [n + 1] offsets of those requests from packed_start

    @cached_property
    def readers(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q_offsets, k_offsets, key_slots, tile_ids) of the cache readers."""
        meta, slots, tile_ids, seen = self.meta, reader_key_slots(self.meta), [], {}
        for own in slots:
            for t in range(0, len(own), KERNEL_TILE):
                key = own[t: t + KERNEL_TILE].numpy().tobytes()
                tile_ids.append(seen.setdefault(key, len(seen)))
        totals = [len(s) for s in slots]
        return (torch.tensor(meta.query_start_loc[: len(slots) + 1]),
                torch.tensor([0] + totals).cumsum(0), torch.cat(slots), torch.tensor(tile_ids))


class CpuNativeBackend(TorchSdpaBackend):
    name = "CPU_NATIVE"

    def build(self, meta: AttentionMetadata) -> CpuNativeMetadata:
        first = meta.num_readers
        start = meta.query_start_loc[first]
        return CpuNativeMetadata(meta, start, torch.tensor(meta.query_start_loc[first:]) - start)

    def forward(self, layer: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        data: CpuNativeMetadata = meta.prepared(self)
        s, t, cache = data.packed_start, q.shape[0], layer.kv_cache
        bf16 = varlen_attention_bf16_kernel() if q.dtype == torch.bfloat16 or (
            q.dtype == torch.float32 and getattr(layer, "bf16_ok", False)) else None
        f32 = varlen_attention_kernel()
        if s > 0 and cache.dtype != torch.float32 and bf16 is None:
            return super().forward(layer, q, k, v, meta)  # readers of a bfloat16 cache
        new = None
        pv = getattr(layer, "bf16_pv", False)
        # a float32 layer's output stays float32, though its q/k/v came rounded to bf16
        out = torch.float32 if getattr(layer, "bf16_ok", False) else q.dtype
        if s < t:
            off, qkv = data.packed_offsets, (q[s:], k[s:], v[s:])
            if bf16 is not None:  # bfloat16 or float32 q/k/v, as they are
                new = bf16(*qkv, off, off, _NONE, _NONE, layer.scale, meta.causal, out,
                           bf16_pv=pv)
            else:
                new = f32(*(x.float() for x in qkv), off, off, _NONE, _NONE, layer.scale,
                          meta.causal).to(q.dtype)
            if s == 0:
                return new
        q_off, k_off, slots, tiles = data.readers
        if bf16 is not None:  # the new rows' kernel, on a cache of the model's dtype
            readers = bf16(q[:s].to(cache.dtype), cache[0], cache[1], q_off, k_off, slots,
                           tiles, layer.scale, meta.causal, out, bf16_pv=pv)
        else:
            readers = f32(q[:s], cache[0], cache[1], q_off, k_off, slots, tiles, layer.scale,
                          meta.causal)
        return readers if new is None else torch.cat([readers, new])
