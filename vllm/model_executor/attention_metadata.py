"""What a forward pass needs to know about the flat batch, passed explicitly to every layer.

The batch is the concatenation of each scheduled request's new tokens. Request `i` has
`num_computed[i]` tokens already in the KV cache (k) and `num_new[i]` tokens in this batch
(n), at flat offsets `query_start_loc[i]:query_start_loc[i+1]`. Attention therefore
attends from the n new queries over k + n keys, causally offset by k.

For speed, requests are bucketed into groups of similar shape (built once per step and
shared by all layers); each group is one padded `scaled_dot_product_attention` call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

# A group may cost at most this much more attention work than its requests need.
MAX_PADDING_WASTE = 1.3


@dataclass
class AttentionGroup:
    """Requests attended together: queries gathered to [b, Lq], keys to [b, Lk]."""

    rows: torch.Tensor                  # [b, Lq] flat index of each query (padding clamped)
    valid: Optional[torch.Tensor]       # [b, Lq] bool; None when nothing is padded
    flat: torch.Tensor                  # [t_g] flat index of the group's valid queries
    key_slots: Optional[torch.Tensor]   # [b, Lk] cache slots when keys come from the cache
    mask: Optional[torch.Tensor]        # [b, 1, Lq, Lk] bool, True = attend; None = no mask
    is_causal: bool                     # let SDPA apply the (square) causal mask itself


@dataclass
class AttentionMetadata:
    query_start_loc: list[int]          # [B + 1] flat offsets of each request's new tokens
    num_computed: list[int]             # [B] k: tokens of the request already in the cache
    num_new: list[int]                  # [B] n: tokens computed in this step
    slot_mapping: Optional[torch.Tensor]  # [T] cache slot of each new token (None: no cache)
    block_tables: list[list[int]]       # [B] block ids holding the request's tokens
    block_size: int
    causal: bool = True
    groups: list[AttentionGroup] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.num_new)

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc[-1]


def build_groups(meta: AttentionMetadata, device: torch.device) -> None:
    """Bucket requests by shape and build each group's indices and mask."""
    order = sorted(range(meta.num_reqs),
                   key=lambda i: (-meta.num_new[i], -(meta.num_computed[i] + meta.num_new[i])))
    meta.groups = [_make_group(meta, members, device) for members in _bucket(meta, order)]


def _bucket(meta: AttentionMetadata, order: list[int]) -> list[list[int]]:
    groups: list[list[int]] = []
    current: list[int] = []
    need = 0
    max_n = max_l = 0
    for i in order:
        n, total = meta.num_new[i], meta.num_computed[i] + meta.num_new[i]
        new_max_n, new_max_l = max(max_n, n), max(max_l, total)
        padded = (len(current) + 1) * new_max_n * new_max_l
        if current and padded > MAX_PADDING_WASTE * (need + n * total):
            groups.append(current)
            current, need, new_max_n, new_max_l = [], 0, n, total
        current.append(i)
        need += n * total
        max_n, max_l = new_max_n, new_max_l
    if current:
        groups.append(current)
    return groups


def _make_group(meta: AttentionMetadata, members: list[int],
                device: torch.device) -> AttentionGroup:
    n = torch.tensor([meta.num_new[i] for i in members])
    k = torch.tensor([meta.num_computed[i] for i in members])
    start = torch.tensor([meta.query_start_loc[i] for i in members])
    lq = int(n.max())
    pos = torch.arange(lq)
    valid = pos[None, :] < n[:, None]
    last = torch.minimum(pos[None, :], n[:, None] - 1)
    rows = start[:, None] + last
    flat = rows[valid]
    uniform = bool((n == lq).all())
    reads_cache = bool((k > 0).any())
    key_slots = mask = None
    if reads_cache:
        total = k + n
        lk = int(total.max())
        kpos = torch.arange(lk)
        key_slots = _key_slots(meta, members, lk)
        q_abs = k[:, None] + last
        mask = (kpos[None, None, :] < total[:, None, None]) & \
               (kpos[None, None, :] <= q_abs[:, :, None]) if meta.causal else \
            (kpos[None, None, :] < total[:, None, None]).expand(-1, lq, -1)
        mask = mask[:, None]
    elif not uniform:
        key_valid = valid[:, None, :]
        mask = key_valid & (pos[None, None, :] <= last[:, :, None]) if meta.causal \
            else key_valid.expand(-1, lq, -1)
        mask = mask[:, None]
    return AttentionGroup(
        rows=rows.to(device), valid=None if uniform else valid.to(device),
        flat=flat.to(device), key_slots=None if key_slots is None else key_slots.to(device),
        mask=None if mask is None else mask.to(device),
        is_causal=meta.causal and mask is None)


def _key_slots(meta: AttentionMetadata, members: list[int], lk: int) -> torch.Tensor:
    """[b, lk] cache slot of every key position (padding points at slot 0, masked)."""
    bs = meta.block_size
    out = torch.zeros(len(members), lk, dtype=torch.long)
    for row, i in enumerate(members):
        total = meta.num_computed[i] + meta.num_new[i]
        blocks = torch.tensor(meta.block_tables[i], dtype=torch.long)
        p = torch.arange(total)
        out[row, :total] = blocks[p // bs] * bs + p % bs
    return out
