"""Attention over a flat, padding-free batch, with an optional paged KV cache.

Causal layers write the new tokens' K/V into their cache slots first, then attend from the
n new queries over the request's k cached + n new keys. On CPU in float32 every request goes
through the C++ packed-sequence kernel (`cpu_kernels`): one call for the requests that read
no cache, one for the cache readers, which reads their keys from the cache slots directly.
In bfloat16 the requests that read no cache take the kernel too (computed in float32).
Writing every new token of the step before any request reads means requests that share a prefix inside one step read
blocks that are already written. Bidirectional layers keep no cache and see exactly
their request's own tokens.

Two optional per-layer features (for ModernBERT, Gemma 2/3): `window` = (left, right), the
farthest a key may sit behind / ahead of its query (a sliding window; causal layers still
never look ahead), and `softcap`, scores -> cap * tanh(scores / cap) before the softmax.
A layer with either runs the per-request masked path (`_masked`), unless the window cannot
cut any key of this step's requests and there is no softcap.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.model_executor.attention_metadata import (AttentionGroup, AttentionMetadata,
                                                    token_slots)
from vllm.model_executor.layers.cpu_kernels import use_varlen_attention, varlen_attention_kernel


_NONE = torch.empty(0, dtype=torch.long)  # an absent optional index for the kernel


class Attention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, num_kv_heads: int,
                 scale: Optional[float] = None, window: Optional[tuple[int, int]] = None,
                 softcap: Optional[float] = None) -> None:
        super().__init__()
        self.window = window
        self.softcap = softcap
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
        if self.softcap is not None or (self.window is not None and self._window_cuts(meta)):
            return self._masked(q, k, v, meta).view(t, -1)
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

    # ----- sliding window / softcapping ---------------------------------------------------
    def _window_cuts(self, meta: AttentionMetadata) -> bool:
        """Whether the window hides any key from any query of this step."""
        longest = max(c + n for c, n in zip(meta.num_computed, meta.num_new))
        left, right = self.window
        return longest - 1 > (left if meta.causal else min(left, right))

    def _masked(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """One request at a time with an explicit mask (window, causality) and softcap;
        cache readers take their keys from the cache slots."""
        out = q.new_empty(q.shape)
        for i in range(meta.num_reqs):
            s, e = meta.query_start_loc[i], meta.query_start_loc[i + 1]
            done = meta.num_computed[i]
            if done > 0:
                slots = token_slots(meta.block_tables[i], 0, done + e - s, meta.block_size)
                keys = self.kv_cache[0][slots.to(q.device)]
                values = self.kv_cache[1][slots.to(q.device)]
            else:
                keys, values = k[s:e], v[s:e]
            mask = self._mask(done, e - s, keys.shape[0], meta.causal, q.device)
            out[s:e] = self._attend(q[s:e], keys, values, mask)
        return out

    def _mask(self, done: int, n: int, total: int, causal: bool,
              device: torch.device) -> Optional[torch.Tensor]:
        """[n, total] bool, True = attend; None when every key is visible."""
        dist = torch.arange(total, device=device)[None, :] - \
            torch.arange(done, done + n, device=device)[:, None]   # key - query
        mask = torch.ones(n, total, dtype=torch.bool, device=device)
        if causal:
            mask &= dist <= 0
        if self.window is not None:
            left, right = self.window
            mask &= (dist >= -left) & (dist <= right)
        return None if bool(mask.all()) else mask

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: Optional[torch.Tensor]) -> torch.Tensor:
        """[n, Hq, D] queries over [L, Hkv, D] keys -> [n, Hq, D]."""
        if self.softcap is None:
            return self._sdpa(q[None], k[None], v[None], mask, False)[0]
        groups = self.num_heads // self.num_kv_heads
        qh = q.transpose(0, 1).float()                                  # [Hq, n, D]
        kh = k.transpose(0, 1).float().repeat_interleave(groups, 0)     # [Hq, L, D]
        vh = v.transpose(0, 1).float().repeat_interleave(groups, 0)
        scores = torch.tanh(qh @ kh.transpose(1, 2) * (self.scale / self.softcap))
        scores = scores * self.softcap
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return (probs @ vh).transpose(0, 1).to(q.dtype)
