"""FLASH_ATTN (CUDA, float16/bfloat16): torch's variable-length flash attention.

Requests that read no cache (laid out last) take one call over their packed rows
(`cu_seqlens` offsets, no padding). Cache readers (laid out first) take a second call whose
keys are gathered from their paged blocks into one packed [sum(k + n), Hkv, D] tensor;
flash attention aligns the causal mask bottom-right when a request has more keys than
queries, which is exactly "n new queries after k cached keys". TRITON_ATTN reads the paged
blocks in place instead (no gather); benchmarks/gpu_check.py times both on the cached
workload. Grouped-query heads are passed through (flash attention handles Hkv < Hq).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from vllm.attention.backends.abstract import AttentionBackend
from vllm.attention.metadata import AttentionMetadata, reader_key_slots


@dataclass
class FlashMetadata:
    packed_start: int                      # flat row of the first request reading no cache
    cu_new: Optional[torch.Tensor]         # int32 [m + 1] offsets of those requests
    max_new: int
    cu_q: Optional[torch.Tensor] = None    # readers: int32 [r + 1] query offsets
    cu_k: Optional[torch.Tensor] = None    # readers: int32 [r + 1] key offsets
    key_slots: Optional[torch.Tensor] = None  # readers: cache slot of every key, packed
    max_q: int = 0
    max_k: int = 0


def _offsets(lengths: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)


class FlashAttentionBackend(AttentionBackend):
    name = "FLASH_ATTN"

    def build(self, meta: AttentionMetadata) -> FlashMetadata:
        r, dev = meta.num_readers, meta.device
        new = meta.num_new[r:]
        data = FlashMetadata(meta.query_start_loc[r], _offsets(new, dev) if new else None,
                             max(new, default=0))
        if r:
            slots = reader_key_slots(meta)
            data.cu_q = _offsets(meta.num_new[:r], dev)
            data.cu_k = _offsets([len(s) for s in slots], dev)
            data.key_slots = torch.cat(slots).to(dev)
            data.max_q, data.max_k = max(meta.num_new[:r]), max(len(s) for s in slots)
        return data

    def forward(self, layer: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        data: FlashMetadata = meta.prepared(self)
        s, t = data.packed_start, q.shape[0]
        new = None
        if s < t:
            new = _flash(q[s:], k[s:], v[s:], data.cu_new, data.cu_new, data.max_new,
                         data.max_new, meta.causal, layer.scale)
            if s == 0:
                return new
        keys = layer.kv_cache[0][data.key_slots]
        values = layer.kv_cache[1][data.key_slots]
        readers = _flash(q[:s], keys, values, data.cu_q, data.cu_k, data.max_q, data.max_k,
                         meta.causal, layer.scale)
        return readers if new is None else torch.cat([readers, new])


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
           cu_k: torch.Tensor, max_q: int, max_k: int, causal: bool,
           scale: float) -> torch.Tensor:
    """Packed [rows, H, D] in and out (torch's flash kernel, no dropout)."""
    out = torch.ops.aten._flash_attention_forward(
        q.contiguous(), k.contiguous(), v.contiguous(), cu_q, cu_k, max_q, max_k, 0.0,
        causal, False, scale=scale)
    return out[0]
