"""What a forward pass needs to know about the flat batch, passed explicitly to every layer.

The batch is the concatenation of each scheduled request's new tokens. Request `i` has
`num_computed[i]` tokens already in the KV cache (k) and `num_new[i]` tokens in this batch
(n), at flat offsets `query_start_loc[i]:query_start_loc[i+1]`. Attention therefore
attends from the n new queries over k + n keys, causally offset by k.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class AttentionMetadata:
    query_start_loc: list[int]          # [B + 1] flat offsets of each request's new tokens
    num_computed: list[int]             # [B] k: tokens of the request already in the cache
    num_new: list[int]                  # [B] n: tokens computed in this step
    slot_mapping: Optional[torch.Tensor]  # [T] cache slot of each new token (None: no cache)
    block_tables: list[list[int]]       # [B] block ids holding the request's tokens
    block_size: int
    # Padded views, built once per step by `build_padded_indices` and shared by all layers.
    query_index: Optional[torch.Tensor] = None   # [B, Lq] flat token index (padding clamped)
    query_valid: Optional[torch.Tensor] = None   # [B, Lq] bool
    key_slots: Optional[torch.Tensor] = None     # [B, Lk] cache slot per key (cached path)
    attn_mask: Optional[torch.Tensor] = None     # [B, 1, Lq, Lk] bool, True = attend
    causal: bool = True

    @property
    def num_reqs(self) -> int:
        return len(self.num_new)

    @property
    def reads_cache(self) -> bool:
        """True when some request attends over keys that are only in the cache."""
        return any(k > 0 for k in self.num_computed)


def build_padded_indices(meta: AttentionMetadata, device: torch.device) -> None:
    """Fill the padded index tensors and the mask used by batched attention.

    Queries are gathered into [B, Lq] (Lq = max n); keys are either the same new tokens
    (nothing cached) or, when a request reads the cache, every slot of its k + n tokens.
    """
    num_new = torch.tensor(meta.num_new, dtype=torch.long)
    num_computed = torch.tensor(meta.num_computed, dtype=torch.long)
    starts = torch.tensor(meta.query_start_loc[:-1], dtype=torch.long)
    lq = int(num_new.max())
    pos = torch.arange(lq)
    meta.query_valid = pos[None, :] < num_new[:, None]
    meta.query_index = starts[:, None] + torch.minimum(pos[None, :], num_new[:, None] - 1)
    # Absolute position of each query row (padded rows repeat the request's last query).
    q_abs = num_computed[:, None] + torch.minimum(pos[None, :], num_new[:, None] - 1)
    if meta.reads_cache:
        total = num_computed + num_new
        lk = int(total.max())
        kpos = torch.arange(lk)
        meta.key_slots = _key_slots(meta, lk)
        k_abs = kpos[None, :]
        key_valid = kpos[None, :] < total[:, None]
    else:
        k_abs = torch.minimum(pos[None, :], num_new[:, None] - 1)
        key_valid = meta.query_valid
    mask = key_valid[:, None, :].expand(-1, lq, -1)
    if meta.causal:
        mask = mask & (k_abs[:, None, :] <= q_abs[:, :, None])
    meta.attn_mask = mask[:, None, :, :].to(device)
    meta.query_index = meta.query_index.to(device)
    meta.query_valid = meta.query_valid.to(device)
    if meta.key_slots is not None:
        meta.key_slots = meta.key_slots.to(device)


def _key_slots(meta: AttentionMetadata, lk: int) -> torch.Tensor:
    """[B, lk] cache slot of every key position (padding points at slot 0, masked)."""
    bs = meta.block_size
    rows = []
    for table, k, n in zip(meta.block_tables, meta.num_computed, meta.num_new):
        blocks = torch.tensor(table, dtype=torch.long)
        p = torch.arange(k + n)
        slots = blocks[p // bs] * bs + p % bs
        rows.append(torch.nn.functional.pad(slots, (0, lk - (k + n))))
    return torch.stack(rows)
