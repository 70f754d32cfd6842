"""Attention with a sliding window and/or logit softcapping (ModernBERT, Gemma 2/3): one
request at a time with an explicit mask, device-neutral, whatever the bound backend.

`window` = (left, right): the farthest a key may sit behind / ahead of its query (causal
layers still never look ahead); `softcap`: scores -> cap * tanh(scores / cap) before the
softmax. A layer with either takes this path unless the window cannot cut any key of the
step's requests and there is no softcap (`needs_mask`); cache readers take their keys from
the cache slots. Without a softcap, the requests that read no cache run as padded batches
(`window_groups`), one SDPA call per group instead of one per request.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from vllm.attention.backends.window_groups import WindowLayout, window_attention
from vllm.attention.metadata import AttentionMetadata, token_slots


def needs_mask(layer: Any, meta: AttentionMetadata) -> bool:
    """Whether this layer's window or softcap changes any score of this step."""
    if layer.softcap is not None:
        return True
    if layer.window is None:
        return False
    longest = max(c + n for c, n in zip(meta.num_computed, meta.num_new))
    left, right = layer.window
    return longest - 1 > (left if meta.causal else min(left, right))


def masked_attention(layer: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     meta: AttentionMetadata) -> torch.Tensor:
    """q: [T, Hq, D], k/v: [T, Hkv, D] -> [T, Hq, D]: cache readers and softcapped layers
    one request at a time, the other requests in padded groups."""
    grouped = layer.softcap is None
    out = q.new_empty(q.shape)
    if grouped:
        groups = meta.prepared(WindowLayout(layer.window))
        if meta.num_readers == 0 and len(groups) == 1:
            return window_attention(layer, q, k, v, groups[0])
        for g in groups:
            out[g.start:g.end] = window_attention(layer, q, k, v, g)
    for i in range(meta.num_readers if grouped else meta.num_reqs):
        s, e = meta.query_start_loc[i], meta.query_start_loc[i + 1]
        done = meta.num_computed[i]
        if done > 0:
            slots = token_slots(meta.block_tables[i], 0, done + e - s, meta.block_size)
            keys = layer.kv_cache[0][slots.to(q.device)]
            values = layer.kv_cache[1][slots.to(q.device)]
        else:
            keys, values = k[s:e], v[s:e]
        mask = _mask(layer.window, done, e - s, keys.shape[0], meta.causal, q.device)
        out[s:e] = _attend(layer, q[s:e], keys, values, mask)
    return out


def _mask(window: Optional[tuple[int, int]], done: int, n: int, total: int, causal: bool,
          device: torch.device) -> Optional[torch.Tensor]:
    """[n, total] bool, True = attend; None when every key is visible."""
    dist = torch.arange(total, device=device)[None, :] - \
        torch.arange(done, done + n, device=device)[:, None]   # key - query
    mask = torch.ones(n, total, dtype=torch.bool, device=device)
    if causal:
        mask &= dist <= 0
    if window is not None:
        left, right = window
        mask &= (dist >= -left) & (dist <= right)
    return None if bool(mask.all()) else mask


def _attend(layer: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            mask: Optional[torch.Tensor]) -> torch.Tensor:
    """[n, Hq, D] queries over [L, Hkv, D] keys -> [n, Hq, D]."""
    if layer.softcap is None:
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=mask, scale=layer.scale,
            enable_gqa=layer.num_kv_heads != layer.num_heads)
        return out[0].transpose(0, 1)
    groups = layer.num_heads // layer.num_kv_heads
    qh = q.transpose(0, 1).float()                                  # [Hq, n, D]
    kh = k.transpose(0, 1).float().repeat_interleave(groups, 0)     # [Hq, L, D]
    vh = v.transpose(0, 1).float().repeat_interleave(groups, 0)
    scores = torch.tanh(qh @ kh.transpose(1, 2) * (layer.scale / layer.softcap))
    scores = scores * layer.softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vh).transpose(0, 1).to(q.dtype)
