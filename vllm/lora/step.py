"""This step's row -> adapter map, read by every LoRA projection and head.

The model runner fills `StepRows` before the forward pass and clears it after. A
projection sees either all T flat rows or, in the last layer under LAST/CLS pooling, only
the pooled rows; a `RowMap` describes each. When adapter rows are at least half the rows,
a projection computes its LoRA term on every row (a mask zeroes the base rows and other
adapters' columns: no gather, no scatter); otherwise on the adapter rows only.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

Rows = Union[None, slice, torch.Tensor]  # None: every row


class RowMap:
    """One row count's map: the adapter slot of every row (0 = base)."""

    def __init__(self, owner: list[int], device) -> None:
        self.slots = sorted(set(owner) - {0})
        lora = [i for i, s in enumerate(owner) if s]
        if 2 * len(lora) >= len(owner):
            self.rows: Rows = None
            picked = owner
        elif lora[-1] - lora[0] + 1 == len(lora):
            self.rows = slice(lora[0], lora[-1] + 1)
            picked = owner[self.rows]
        else:
            self.rows = torch.tensor(lora, dtype=torch.long, device=device)
            picked = [owner[i] for i in lora]
        self._picked = torch.tensor(picked, dtype=torch.long, device=device)
        self._masks: dict[tuple, Optional[torch.Tensor]] = {}

    def mask(self, columns: tuple[int, ...], dtype: torch.dtype) -> Optional[torch.Tensor]:
        """[rows, len(columns)]: 1 where a row's adapter owns the column (None: all 1)."""
        key = (columns, dtype)
        if key not in self._masks:
            if self.rows is not None and len(self.slots) == 1:
                self._masks[key] = None  # only this adapter's rows were taken
            else:
                cols = torch.tensor(columns, dtype=torch.long, device=self._picked.device)
                self._masks[key] = (self._picked[:, None] == cols[None, :]).to(dtype)
        return self._masks[key]


class StepRows:
    """This step's `RowMap`s by row count, and the adapter of each pooled request."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._maps: dict[int, RowMap] = {}
        self.pooled: list[int] = []   # adapter slot (0 = base) of each finishing request
        self._cursor = 0

    def set(self, slots: list[int], starts: list[int], pooled_rows: Optional[list[int]],
            pooled: list[int], device) -> None:
        """`slots[i]`: request i's adapter slot (0 = base), its rows starts[i]:starts[i+1];
        `pooled_rows`: the flat rows the last layer keeps (None: all); `pooled`: the slot of
        each finishing request, in pooling order."""
        self.clear()
        self.pooled = pooled
        if not any(slots):
            return
        owner = [0] * starts[-1]
        for i, s in enumerate(slots):
            owner[starts[i]: starts[i + 1]] = [s] * (starts[i + 1] - starts[i])
        self._maps[len(owner)] = RowMap(owner, device)
        if pooled_rows is not None and len(pooled_rows) not in self._maps:
            picked = [owner[r] for r in pooled_rows]
            if any(picked):
                self._maps[len(picked)] = RowMap(picked, device)
            else:
                self._maps[len(picked)] = None  # type: ignore[assignment]

    def rows(self, num_rows: int) -> Optional[RowMap]:
        """The map of a projection input with `num_rows` rows (None: no adapter rows)."""
        if not self._maps:
            return None
        if num_rows not in self._maps:
            raise RuntimeError(f"LoRA: a projection saw {num_rows} rows; this step has "
                               f"{sorted(self._maps)}.")
        return self._maps[num_rows]

    def head_slots(self, num_rows: int, per_request: bool) -> list[int]:
        """Adapter slot of each row a task head sees: one row per finishing request, or
        (`per_request`: ALL/STEP pooling, the head runs once per request) that request's."""
        if not per_request:
            if len(self.pooled) != num_rows:
                raise RuntimeError(f"LoRA heads: the head saw {num_rows} rows for "
                                   f"{len(self.pooled)} pooled requests.")
            return self.pooled
        slot = self.pooled[self._cursor] if self._cursor < len(self.pooled) else 0
        self._cursor += 1
        return [slot] * num_rows
