"""TORCH_SDPA's layout: requests bucketed into groups that each take one SDPA call.

A group is consecutive requests (flat tokens `start:end`) of one of three kinds:
- "view": equal lengths, nothing cached: one batched call on a zero-copy view;
- "loop": nothing cached, mixed lengths: one call per request on zero-copy slices
  (cheaper on CPU than gathering into a padded batch);
- "padded": some keys are in the cache: queries gathered to [b, Lq], keys gathered from
  their cache slots to [b, Lk], with an explicit causal mask.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from vllm.attention.metadata import AttentionMetadata, token_slots

# A padded group may cost at most this much more attention work than its requests need.
MAX_PADDING_WASTE = 1.3


@dataclass
class AttentionGroup:
    kind: str
    start: int
    end: int
    lengths: list[int]                  # n of each request, in flat order
    rows: Optional[torch.Tensor] = None       # padded: [b, Lq] flat query index (clamped)
    valid: Optional[torch.Tensor] = None      # padded: [b, Lq] bool, None if not padded
    key_slots: Optional[torch.Tensor] = None  # padded: [b, Lk] cache slot of each key
    mask: Optional[torch.Tensor] = None       # padded: [b, 1, Lq, Lk] bool, True = attend


def build_groups(meta: AttentionMetadata) -> list[AttentionGroup]:
    """Split the requests (laid out in `sort_key` order) into attention groups."""
    groups: list[AttentionGroup] = []
    i = 0
    while i < meta.num_reqs:
        if meta.num_computed[i] > 0:
            j = _padded_run_end(meta, i)
            groups.append(_padded_group(meta, list(range(i, j))))
        else:
            j = i + 1
            while j < meta.num_reqs and meta.num_computed[j] == 0 and \
                    meta.num_new[j] == meta.num_new[i]:
                j += 1
            start, end = meta.query_start_loc[i], meta.query_start_loc[j]
            if j - i == 1 and groups and groups[-1].kind == "loop":
                groups[-1].end = end
                groups[-1].lengths.append(meta.num_new[i])
            else:
                groups.append(AttentionGroup("view" if j - i > 1 else "loop", start, end,
                                             meta.num_new[i:j]))
        i = j
    return groups


def _padded_run_end(meta: AttentionMetadata, i: int) -> int:
    """Extend a group of cache-reading requests while padding stays under the bound."""
    need = max_n = max_l = 0
    j = i
    while j < meta.num_reqs and meta.num_computed[j] > 0:
        n, total = meta.num_new[j], meta.num_computed[j] + meta.num_new[j]
        padded = (j - i + 1) * max(max_n, n) * max(max_l, total)
        if j > i and padded > MAX_PADDING_WASTE * (need + n * total):
            break
        need += n * total
        max_n, max_l = max(max_n, n), max(max_l, total)
        j += 1
    return j


def _padded_group(meta: AttentionMetadata, members: list[int]) -> AttentionGroup:
    device = meta.device
    n = torch.tensor([meta.num_new[i] for i in members])
    k = torch.tensor([meta.num_computed[i] for i in members])
    lq = int(n.max())
    pos = torch.arange(lq)
    valid = pos[None, :] < n[:, None]
    last = torch.minimum(pos[None, :], n[:, None] - 1)
    rows = torch.tensor([meta.query_start_loc[i] for i in members])[:, None] + last
    total = k + n
    lk = int(total.max())
    kpos = torch.arange(lk)[None, None, :]
    mask = kpos < total[:, None, None]
    if meta.causal:
        mask = mask & (kpos <= (k[:, None] + last)[:, :, None])
    uniform = bool((n == lq).all())
    return AttentionGroup(
        "padded", meta.query_start_loc[members[0]], meta.query_start_loc[members[-1] + 1],
        [meta.num_new[i] for i in members], rows=rows.to(device),
        valid=None if uniform else valid.to(device),
        key_slots=_key_slots(meta, members, lk).to(device), mask=mask[:, None].to(device))


def _key_slots(meta: AttentionMetadata, members: list[int], lk: int) -> torch.Tensor:
    """[b, lk] cache slot of every key position (padding points at slot 0, masked)."""
    bs = meta.block_size
    out = torch.zeros(len(members), lk, dtype=torch.long)
    for row, i in enumerate(members):
        total = meta.num_computed[i] + meta.num_new[i]
        out[row, :total] = token_slots(meta.block_tables[i], 0, total, bs)
    return out
