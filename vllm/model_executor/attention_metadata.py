"""What a forward pass needs to know about the flat batch, passed explicitly to every layer.

The batch is the concatenation of each scheduled request's new tokens. Request `i` has
`num_computed[i]` tokens already in the KV cache (k) and `num_new[i]` tokens in this batch
(n), at flat offsets `query_start_loc[i]:query_start_loc[i+1]`. Attention therefore
attends from the n new queries over k + n keys, causally offset by k.

The two attention paths each read their own layout, built on first use and shared by all
layers of the step: `groups` buckets requests of similar shape for torch SDPA calls;
`readers` describes the cache-reading requests for the C++ kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

# A group may cost at most this much more attention work than its requests need.
MAX_PADDING_WASTE = 1.3
# Keys per tile of the C++ attention kernel (csrc/varlen_attention.cpp, BK).
KERNEL_TILE = 64


@dataclass
class AttentionGroup:
    """Consecutive requests attended together (flat tokens `start:end`), one of three kinds:

    - "view": equal lengths, nothing cached: one batched call on a zero-copy view;
    - "loop": nothing cached, mixed lengths: one call per request on zero-copy slices
      (cheaper on CPU than gathering into a padded batch);
    - "padded": some keys are in the cache: queries gathered to [b, Lq], keys gathered
      from their cache slots to [b, Lk], with an explicit causal mask.
    """

    kind: str
    start: int
    end: int
    lengths: list[int]                  # n of each request, in flat order
    rows: Optional[torch.Tensor] = None       # padded: [b, Lq] flat query index (clamped)
    valid: Optional[torch.Tensor] = None      # padded: [b, Lq] bool, None if not padded
    key_slots: Optional[torch.Tensor] = None  # padded: [b, Lk] cache slot of each key
    mask: Optional[torch.Tensor] = None       # padded: [b, 1, Lq, Lk] bool, True = attend


@dataclass
class ReaderLayout:
    """The cache-reading requests (laid out first) as the C++ kernel takes them."""

    q_offsets: torch.Tensor   # [r + 1] flat offsets of their queries
    k_offsets: torch.Tensor   # [r + 1] offsets of their keys (prefix + new tokens)
    key_slots: torch.Tensor   # [sum of keys] cache slot of each key
    tile_ids: torch.Tensor    # one id per 64-key tile of keys, equal for equal tiles


def token_slots(block_ids: Sequence[int], start: int, end: int,
                block_size: int) -> torch.Tensor:
    """Cache slots of a request's token positions start..end-1, given its blocks."""
    p = torch.arange(start, end)
    return torch.as_tensor(block_ids, dtype=torch.long)[p // block_size] * block_size + \
        p % block_size


@dataclass
class AttentionMetadata:
    query_start_loc: list[int]          # [B + 1] flat offsets of each request's new tokens
    num_computed: list[int]             # [B] k: tokens of the request already in the cache
    num_new: list[int]                  # [B] n: tokens computed in this step
    slot_mapping: Optional[torch.Tensor]  # [T] cache slot of each new token (None: no cache)
    block_tables: list[list[int]]       # [B] block ids holding the request's tokens
    block_size: int
    causal: bool = True
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # Flat rows whose final hidden state is needed (LAST/CLS pooling of the requests that
    # finish in this step, in pooling order); None = every row. The last layer computes
    # its output only for these rows; earlier layers still run every token (their K/V).
    output_rows: Optional[torch.Tensor] = None
    # For the packed-sequence kernel: the requests that read no cache sit last, from flat
    # row `packed_start` (T when there are none), with [n + 1] offsets from there.
    packed_start: int = field(init=False)
    packed_offsets: torch.Tensor = field(init=False)
    _groups: Optional[list[AttentionGroup]] = field(default=None, init=False, repr=False)
    _readers: Optional[ReaderLayout] = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        first = next((i for i, k in enumerate(self.num_computed) if k == 0), self.num_reqs)
        self.packed_start = self.query_start_loc[first]
        self.packed_offsets = torch.tensor(self.query_start_loc[first:]) - self.packed_start

    @property
    def num_reqs(self) -> int:
        return len(self.num_new)

    @property
    def groups(self) -> list[AttentionGroup]:
        """The torch SDPA path's buckets, built on first use."""
        if self._groups is None:
            self._groups = build_groups(self)
        return self._groups

    @property
    def readers(self) -> ReaderLayout:
        """The C++ kernel's view of the cache readers, built on first use."""
        if self._readers is None:
            self._readers = _reader_layout(self)
        return self._readers


def sort_key(num_computed: int, num_new: int) -> tuple[bool, int, int]:
    """The runner's layout order: requests reading the cache first (grouped by shape),
    then the rest longest first, so every group is a contiguous slice."""
    return (num_computed == 0, -num_new, -(num_computed + num_new))


def build_groups(meta: AttentionMetadata) -> list[AttentionGroup]:
    """Split the requests (laid out in `sort_key` order) into attention groups."""
    groups: list[AttentionGroup] = []
    i = 0
    while i < meta.num_reqs:
        if meta.num_computed[i] > 0:
            j = _padded_run_end(meta, i)
            groups.append(_padded_group(meta, list(range(i, j)), meta.device))
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


def _reader_layout(meta: AttentionMetadata) -> ReaderLayout:
    readers = sum(1 for k in meta.num_computed if k > 0)
    totals = [meta.num_computed[i] + meta.num_new[i] for i in range(readers)]
    slots, tile_ids, seen = [], [], {}
    for i, total in enumerate(totals):
        own = token_slots(meta.block_tables[i], 0, total, meta.block_size)
        slots.append(own)
        for t in range(0, total, KERNEL_TILE):
            key = own[t: t + KERNEL_TILE].numpy().tobytes()
            tile_ids.append(seen.setdefault(key, len(seen)))
    return ReaderLayout(torch.tensor(meta.query_start_loc[: readers + 1]),
                        torch.tensor([0] + totals).cumsum(0),
                        torch.cat(slots).to(meta.device), torch.tensor(tile_ids))


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


def _padded_group(meta: AttentionMetadata, members: list[int],
                  device: torch.device) -> AttentionGroup:
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
