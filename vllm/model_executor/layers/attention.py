"""Attention over a flat, padding-free batch, with an optional paged KV cache.

Causal layers write the new tokens' K/V into their cache slots first, then attend from the
n new queries over the request's k cached + n new keys. On CPU in float32 every request goes
through the C++ packed-sequence kernel (`cpu_kernels`): one call for the requests that read
no cache, one for the cache readers, which reads their keys from the cache slots directly.
In bfloat16 the requests that read no cache take the kernel too (computed in float32).
Writing every new token of the step before any request reads means requests that share a prefix inside one step read
blocks that are already written. Bidirectional layers keep no cache and see exactly
their request's own tokens.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.model_executor.attention_metadata import AttentionGroup, AttentionMetadata
from vllm.model_executor.layers.cpu_kernels import use_varlen_attention, varlen_attention_kernel


_NONE = torch.empty(0, dtype=torch.long)  # an absent optional index for the kernel


class Attention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, num_kv_heads: int,
                 scale: Optional[float] = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_kv_heads = num_kv_heads
        self.scale = scale if scale is not None else head_dim ** -0.5
        # [2, num_slots, num_kv_heads, head_dim], bound by the model runner (None: no cache).
        self.kv_cache: Optional[torch.Tensor] = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, Hq*D], k/v: [T, Hkv*D] -> [T, Hq*D]."""
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.kv_cache is not None and meta.slot_mapping is not None:
            self.kv_cache[0].index_copy_(0, meta.slot_mapping, k)
            self.kv_cache[1].index_copy_(0, meta.slot_mapping, v)
        if use_varlen_attention(q, self.head_dim) and (meta.packed_start == 0 or (
                self.kv_cache is not None and self.kv_cache.dtype == torch.float32)):
            return self._packed(q, k, v, meta).view(t, -1)
        if len(meta.groups) == 1 and meta.groups[0].kind != "loop":
            return self._group(q, k, v, meta.groups[0], meta.causal).reshape(t, -1)
        out = q.new_empty(t, self.num_heads, self.head_dim)
        for g in meta.groups:
            if g.kind == "loop":
                self._loop(q, k, v, g, meta.causal, out)
            else:
                out[g.start: g.end] = self._group(q, k, v, g, meta.causal)
        return out.view(t, -1)

    def _packed(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """Every request in C++ kernel calls: one for the requests that read no cache, one
        for the cache readers (laid out first), whose keys it reads from the cache slots."""
        kernel, s, t = varlen_attention_kernel(), meta.packed_start, q.shape[0]
        new = None
        if s < t:
            off = meta.packed_offsets
            new = kernel(*(x[s:].float() for x in (q, k, v)), off, off, _NONE, _NONE,
                         self.scale, meta.causal).to(q.dtype)
            if s == 0:
                return new
        r = meta.readers
        readers = kernel(q[:s], self.kv_cache[0], self.kv_cache[1], r.q_offsets, r.k_offsets,
                         r.key_slots, r.tile_ids, self.scale, meta.causal)
        return readers if new is None else torch.cat([readers, new])

    def _group(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               g: AttentionGroup, causal: bool) -> torch.Tensor:
        """Attention of a "view" or "padded" group: its [t_g, Hq, D] rows in flat order."""
        if g.kind == "view":
            b = len(g.lengths)
            o = self._sdpa(*(self._view(x, g.start, g.end, b) for x in (q, k, v)), None, causal)
            return o.reshape(-1, self.num_heads, self.head_dim)
        qp = q[g.rows]                                             # [b, Lq, Hq, D]
        kp = self.kv_cache[0][g.key_slots]                         # [b, Lk, Hkv, D]
        vp = self.kv_cache[1][g.key_slots]
        o = self._sdpa(qp, kp, vp, g.mask, False)                  # [b, Lq, Hq, D]
        return o[g.valid] if g.valid is not None else o.reshape(-1, *o.shape[2:])

    def _loop(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: AttentionGroup,
              causal: bool, out: torch.Tensor) -> None:
        """One call per request on zero-copy slices, written straight into `out`."""
        s = g.start
        for n in g.lengths:
            o = self._sdpa(*(self._view(x, s, s + n, 1) for x in (q, k, v)), None, causal)
            out[s: s + n] = o[0]
            s += n

    @staticmethod
    def _view(x: torch.Tensor, start: int, end: int, b: int) -> torch.Tensor:
        """Flat rows start:end as [b, L, heads, D] without copying."""
        return x[start:end].view(b, -1, x.shape[1], x.shape[2])

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: Optional[torch.Tensor], is_causal: bool) -> torch.Tensor:
        """[B, L, H, D] tensors in, [B, Lq, Hq, D] out."""
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
            is_causal=is_causal and mask is None, scale=self.scale,
            enable_gqa=self.num_kv_heads != self.num_heads)
        return out.transpose(1, 2)
