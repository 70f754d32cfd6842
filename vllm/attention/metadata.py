"""What a forward pass needs to know about the flat batch, passed explicitly to every layer.

The batch is the concatenation of each scheduled request's new tokens. Request `i` has
`num_computed[i]` tokens already in the KV cache (k) and `num_new[i]` tokens in this batch
(n), at flat offsets `query_start_loc[i]:query_start_loc[i+1]`. Attention therefore
attends from the n new queries over k + n keys, causally offset by k.

This is the one description every attention backend reads; each builds its own layout from
it once per step (`prepared`), and every layer of the step shares that layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch


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
    _prepared: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    @property
    def num_reqs(self) -> int:
        return len(self.num_new)

    @property
    def num_readers(self) -> int:
        """Requests that read cached keys (k > 0); the runner lays them out first."""
        return sum(1 for k in self.num_computed if k > 0)

    def prepared(self, backend: Any) -> Any:
        """`backend.build(self)`, built on first use and shared by every layer."""
        data = self._prepared.get(backend.name)
        if data is None:
            data = self._prepared[backend.name] = backend.build(self)
        return data


def sort_key(num_computed: int, num_new: int) -> tuple[bool, int, int]:
    """The runner's layout order: requests reading the cache first (grouped by shape),
    then the rest longest first, so every backend's groups are contiguous slices."""
    return (num_computed == 0, -num_new, -(num_computed + num_new))


def reader_key_slots(meta: AttentionMetadata) -> list[torch.Tensor]:
    """For each cache reader (laid out first), the cache slot of each of its k + n keys."""
    return [token_slots(meta.block_tables[i], 0, meta.num_computed[i] + meta.num_new[i],
                        meta.block_size) for i in range(meta.num_readers)]
