"""Sliding-window attention of the requests that read no cache, as padded batches.

Calling SDPA once per request with its own window mask costs, per layer, one call and a
freshly built mask for every request; on a CPU a step of a few hundred short texts spends
more time on those calls than on the attention arithmetic. Here the requests that read no
cache (laid out longest first) are cut into groups whose padded work, b x L x L for b
requests padded to the longest L, stays within `MAX_PADDING_WASTE` of the exact work
(sum of n x n); each group is one SDPA call on [b, L] gathered rows with one
[b, 1, L, L] mask (window, causality, and the padding keys cut), built once per step and
shared by every layer with the same window. Padded keys are masked out and padded query
rows are dropped, so the result is the per-request one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from vllm.attention.metadata import AttentionMetadata

MAX_PADDING_WASTE = 1.3


@dataclass
class WindowGroup:
    start: int                       # flat rows start:end
    end: int
    rows: torch.Tensor               # [b, L] flat row of each position (padding: clamped)
    valid: Optional[torch.Tensor]    # [b, L] bool, None when no position is padding
    mask: torch.Tensor               # [b, 1, L, L] bool, True = attend


class WindowLayout:
    """`meta.prepared(WindowLayout(window))`: the groups of one window, once per step."""

    def __init__(self, window: tuple[int, int]) -> None:
        self.window = window
        self.name = f"WINDOW{window}"

    def build(self, meta: AttentionMetadata) -> list[WindowGroup]:
        groups: list[WindowGroup] = []
        i = meta.num_readers
        while i < meta.num_reqs:
            j = _run_end(meta.num_new, i)
            groups.append(_group(meta, i, j, self.window))
            i = j
        return groups


def _run_end(lengths: list[int], i: int) -> int:
    """Extend a group from request i (the longest) while padding stays under the bound."""
    longest, need, j = lengths[i], 0, i
    while j < len(lengths):
        need += lengths[j] ** 2
        if j > i and (j - i + 1) * longest ** 2 > MAX_PADDING_WASTE * need:
            break
        j += 1
    return j


def _group(meta: AttentionMetadata, i: int, j: int, window: tuple[int, int]) -> WindowGroup:
    n = torch.tensor(meta.num_new[i:j])
    size = int(n.max())
    pos = torch.arange(size)
    valid = pos[None, :] < n[:, None]                                   # [b, L]
    rows = torch.tensor(meta.query_start_loc[i:j])[:, None] + \
        torch.minimum(pos[None, :], n[:, None] - 1)
    dist = pos[None, :] - pos[:, None]                                  # key - query
    left, right = window
    near = (dist >= -left) & (dist <= (0 if meta.causal else right))   # [L, L]
    # Padded query rows see every real key (never an empty row); they are dropped anyway.
    mask = valid[:, None, :] & (near[None] | ~valid[:, :, None])        # [b, L, L]
    device = meta.device
    return WindowGroup(meta.query_start_loc[i], meta.query_start_loc[j], rows.to(device),
                       None if bool(valid.all()) else valid.to(device),
                       mask[:, None].to(device))


def window_attention(layer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     group: WindowGroup) -> torch.Tensor:
    """The group's rows of q: [T, Hq, D] over k/v: [T, Hkv, D] -> [end - start, Hq, D]."""
    qp, kp, vp = (x[group.rows].transpose(1, 2) for x in (q, k, v))     # [b, H, L, D]
    o = torch.nn.functional.scaled_dot_product_attention(
        qp, kp, vp, attn_mask=group.mask, scale=layer.scale,
        enable_gqa=layer.num_kv_heads != layer.num_heads).transpose(1, 2)
    return o[group.valid] if group.valid is not None else o.reshape(-1, *o.shape[2:])
