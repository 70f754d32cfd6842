"""CPU_NATIVE: the C++ packed-sequence kernel (csrc/varlen_attention.cpp) for every request.

Two kernel calls per layer: one for the requests that read no cache (laid out last, keys
are their own new rows), one for the cache readers (laid out first), whose keys it reads
from the cache slots directly, tile by tile; tiles of keys shared by several readers (a
common prefix) carry one id, so the kernel reuses their work. In bfloat16 the kernel
computes in float32 (1.8x torch's bfloat16 SDPA on MiniLM's shapes, and exact-er); a
bfloat16 cache, which the kernel cannot read, sends the readers to TORCH_SDPA's path.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from vllm.attention.backends.torch_sdpa import TorchSdpaBackend
from vllm.attention.metadata import AttentionMetadata, reader_key_slots
from vllm._kernels.cpu_kernels import varlen_attention_kernel

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
        kernel, s, t = varlen_attention_kernel(), data.packed_start, q.shape[0]
        if s > 0 and layer.kv_cache.dtype != torch.float32:
            return super().forward(layer, q, k, v, meta)  # readers of a bfloat16 cache
        new = None
        if s < t:
            off = data.packed_offsets
            new = kernel(*(x[s:].float() for x in (q, k, v)), off, off, _NONE, _NONE,
                         layer.scale, meta.causal).to(q.dtype)
            if s == 0:
                return new
        q_off, k_off, slots, tiles = data.readers
        readers = kernel(q[:s], layer.kv_cache[0], layer.kv_cache[1], q_off, k_off, slots,
                         tiles, layer.scale, meta.causal)
        return readers if new is None else torch.cat([readers, new])

