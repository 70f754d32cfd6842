"""What CLS / MEAN / ALL / STEP pooling keep across steps, exactly, on causal models.

On a causal model a token's final hidden state depends only on the tokens before it, so
a pooled result can be built piece by piece:

- chunked prefill: each request keeps a `RequestPoolState` across its steps (MEAN a
  float32 running sum, CLS the CLS position's row, ALL/STEP every row so far); its last
  chunk pools exactly what one unchunked pass would;
- prefix caching: each KV block carries a pooling payload in a `BlockPayloadStore` (MEAN
  the float32 sum of the block's rows, CLS the CLS position's row, ALL/STEP every row,
  before any head), written by the step that computes the block and read by a request
  that finds the block cached.

Where the payload depends on a request setting (MEAN's and CLS's leading prompt tokens
left out when a sentence-transformers Pooling has include_prompt false), `pool_key` names
it and the block hash carries it, so blocks are only shared between requests whose
payloads agree. STEP and ALL cache every row before the head, so `step_tag_id` and
`returned_token_ids` (applied after the head) change nothing cached.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

PAYLOAD_KINDS = ("CLS", "MEAN", "ALL", "STEP")

_DESCRIPTION = {
    "MEAN": "the float32 sum of its tokens' final hidden states",
    "CLS": "the CLS token's final hidden state (the block holding that token)",
    "ALL": "every token's final hidden state (before the head)",
    "STEP": "every token's final hidden state (before the head; step tags, "
            "returned_token_ids and the activation are applied after)",
}


def describe_payload(kind: str) -> str:
    """One phrase for the start-up log: what a cached block carries for `kind` pooling."""
    return _DESCRIPTION[kind]


def pool_position(kind: str, skip: int, num_tokens: int) -> int:
    """MEAN: the first position that counts; CLS: the position whose row is pooled
    (the first token after a left-out prompt, as the unchunked pooler); else 0."""
    if kind == "MEAN":
        return min(skip, num_tokens)
    if kind == "CLS":
        return skip if skip < num_tokens else 0
    return 0


def pool_key(kind: str, skip: int, num_tokens: int) -> Optional[str]:
    """The payload setting a block hash must carry, or None when payloads never differ."""
    pos = pool_position(kind, skip, num_tokens)
    return f"{kind}@{pos}" if pos else None


@dataclass(eq=False)
class RequestPoolState:
    """One request's partial pooled result: every position below `done` is accounted."""

    kind: str
    position: int          # see pool_position
    num_tokens: int
    done: int = 0
    total: Optional[torch.Tensor] = None     # MEAN: float32 sum of the counted rows
    cls_row: Optional[torch.Tensor] = None   # CLS: the row at `position`
    rows: list[torch.Tensor] = field(default_factory=list)  # ALL / STEP, in order

    def add(self, rows: Optional[torch.Tensor], start: int, n: int) -> None:
        """Account the `n` positions from `start` computed in this step: `rows` holds
        their final hidden states (CLS: only the CLS row when it is among them, else
        None)."""
        if self.kind == "MEAN":
            first = max(self.position - start, 0)
            if first < n:
                self._add_sum(rows[first:].float().sum(0))
        elif self.kind == "CLS":
            if rows is not None:
                self.cls_row = rows.clone()
        else:
            self.rows.append(rows.clone())
        self.done = start + n

    def _add_sum(self, s: torch.Tensor) -> None:
        self.total = s if self.total is None else self.total + s

    def load(self, store: "BlockPayloadStore", block_ids: list[int], upto: int) -> None:
        """Account positions done .. upto-1 (whole cached blocks) from their payloads."""
        bs = store.block_size
        assert self.done % bs == 0 and upto % bs == 0, (self.done, upto)
        blocks = block_ids[self.done // bs: upto // bs]
        if self.kind == "MEAN":
            self._add_sum(store.sums[blocks].sum(0))
        elif self.kind == "CLS":
            if self.done <= self.position < upto:
                self.cls_row = store.cls[block_ids[self.position // bs]].clone()
        else:
            slots = (torch.as_tensor(blocks, dtype=torch.long)[:, None] * bs +
                     torch.arange(bs)).flatten()
            self.rows.append(store.rows[slots.to(store.rows.device)])
        self.done = upto

    def vector(self) -> torch.Tensor:
        """MEAN / CLS: the pooled vector (MEAN in float32, as the unchunked pooler)."""
        if self.kind == "CLS":
            return self.cls_row
        count = max(self.num_tokens - self.position, 1)
        return self.total / count if self.total is not None else None

    def all_rows(self) -> torch.Tensor:
        """ALL / STEP: every position's final hidden state, in order."""
        return self.rows[0] if len(self.rows) == 1 else torch.cat(self.rows)


class BlockPayloadStore:
    """Per KV block, what its tokens contribute to the pooled result (see module doc).

    Owned by the worker beside the KV tensors and indexed by the same block ids; a block
    is written by the request that computes it (MEAN's sum is zeroed when the block's
    first slot is written), so a block found by its hash carries its payload."""

    def __init__(self, kind: str, num_blocks: int, block_size: int, hidden_size: int,
                 dtype: torch.dtype, device) -> None:
        self.kind, self.block_size = kind, block_size
        if kind == "MEAN":
            self.sums = torch.zeros(num_blocks, hidden_size, dtype=torch.float32, device=device)
        elif kind == "CLS":
            self.cls = torch.zeros(num_blocks, hidden_size, dtype=dtype, device=device)
        else:
            self.rows = torch.zeros(num_blocks * block_size, hidden_size, dtype=dtype,
                                    device=device)

    @staticmethod
    def bytes_per_block(kind: str, block_size: int, hidden_size: int,
                        dtype: torch.dtype) -> int:
        """Memory one block's payload takes (counted in the KV cache's block budget)."""
        itemsize = torch.tensor([], dtype=dtype).element_size()
        return {"MEAN": hidden_size * 4, "CLS": hidden_size * itemsize}.get(
            kind, block_size * hidden_size * itemsize)

    def write(self, hidden: torch.Tensor, slots: torch.Tensor,
              counted: Optional[torch.Tensor] = None) -> None:
        """MEAN / ALL / STEP: the step's rows `hidden` [T, H] at cache `slots` [T];
        MEAN adds only the `counted` rows (a bool mask) to their blocks' sums."""
        if self.kind == "MEAN":
            blocks = slots // self.block_size
            self.sums[blocks[slots % self.block_size == 0]] = 0.0
            if counted is not None:
                blocks, hidden = blocks[counted], hidden[counted]
            self.sums.index_add_(0, blocks, hidden.float())
        else:
            self.rows.index_copy_(0, slots, hidden.to(self.rows.dtype))

    def write_cls(self, block_id: int, row: torch.Tensor) -> None:
        """CLS: the CLS position's row, in the block that holds that position."""
        self.cls[block_id] = row
