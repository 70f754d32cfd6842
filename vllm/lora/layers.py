"""The per-step LoRA add: a projection's rows grouped by adapter, `x @ A_i @ B_i * s_i`
added to each group's rows of the base output (no weight merge, base rows untouched).

`StepRows` is the one description of the step's row -> adapter mapping; the model runner
fills it before the forward pass and clears it after. Every LoRA-carrying `Linear` holds
a `LoRALayer` (its adapters' factors, keyed by slot) that reads it. A layer sees either
all T flat rows or, in the last layer under LAST/CLS pooling, only the pooled rows; the
mapping knows both.
"""
from __future__ import annotations

import copy
from typing import Optional, Union

import torch
from torch import nn

from vllm.model_executor.layers.linear import GatedLinear, Linear, apply_activation

Rows = Union[slice, torch.Tensor]
Group = tuple[int, Rows]  # (adapter slot, its rows)


class StepRows:
    """This step's flat rows per adapter slot (base rows are in no group)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._by_count: dict[int, list[Group]] = {}
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
        runs = [(s, starts[i], starts[i + 1]) for i, s in enumerate(slots) if s]
        self._by_count[starts[-1]] = _groups(runs, device)
        if pooled_rows is not None:
            owner = _row_owner(slots, starts)
            picked = [(owner[r], j, j + 1) for j, r in enumerate(pooled_rows) if owner[r]]
            self._by_count.setdefault(len(pooled_rows), _groups(picked, device))

    def groups(self, num_rows: int) -> list[Group]:
        """The adapter groups of a projection input with `num_rows` rows."""
        if not self._by_count:
            return []
        found = self._by_count.get(num_rows)
        if found is None:
            raise RuntimeError(f"LoRA: a projection saw {num_rows} rows; this step has "
                               f"{sorted(self._by_count)}.")
        return found

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


def _row_owner(slots: list[int], starts: list[int]) -> list[int]:
    owner = [0] * starts[-1]
    for i, s in enumerate(slots):
        owner[starts[i]: starts[i + 1]] = [s] * (starts[i + 1] - starts[i])
    return owner


def _groups(runs: list[tuple[int, int, int]], device) -> list[Group]:
    """(slot, start, end) runs -> one group per slot: a slice when its rows are one run."""
    by_slot: dict[int, list[tuple[int, int]]] = {}
    for slot, a, b in runs:
        spans = by_slot.setdefault(slot, [])
        if spans and spans[-1][1] == a:
            spans[-1] = (spans[-1][0], b)
        else:
            spans.append((a, b))
    out: list[Group] = []
    for slot, spans in by_slot.items():
        if len(spans) == 1:
            out.append((slot, slice(*spans[0])))
        else:
            idx = torch.cat([torch.arange(a, b) for a, b in spans]).to(device)
            out.append((slot, idx))
    return out


class LoRALayer:
    """The adapters of one `Linear`: slot -> (A^T [in, R], s * B^T [R, out])."""

    def __init__(self, step: StepRows) -> None:
        self.step = step
        self.factors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def groups(self, x: torch.Tensor) -> list[tuple[tuple[torch.Tensor, torch.Tensor], Rows]]:
        """The step's groups whose adapter has factors here (empty: run the base path)."""
        return [(self.factors[s], rows) for s, rows in self.step.groups(x.shape[0])
                if s in self.factors]

    def forward(self, layer: Linear, x: torch.Tensor, groups, residual=None,
                other=None) -> torch.Tensor:
        """The layer's output with each group's delta added before its epilogue."""
        if isinstance(layer, GatedLinear):
            gate, up = layer.project(x)
            width = gate.shape[1]
            for (a_t, b_t), rows in groups:
                d = _delta(x, rows, a_t, b_t)
                _add(gate, rows, d[:, :width])
                _add(up, rows, d[:, width:])
            return apply_activation(layer.gate_activation, gate) * up
        y = layer.project(x)
        for (a_t, b_t), rows in groups:
            _add(y, rows, _delta(x, rows, a_t, b_t))
        if layer.activation is not None:
            y = apply_activation(layer.activation, y)
        if residual is not None:
            y += residual
        if other is not None:
            y *= other
        return y


def _delta(x: torch.Tensor, rows: Rows, a_t: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    xs = x[rows] if isinstance(rows, slice) else x.index_select(0, rows)
    return (xs @ a_t) @ b_t


def _add(y: torch.Tensor, rows: Rows, d: torch.Tensor) -> None:
    if isinstance(rows, slice):
        y[rows] += d
    else:
        y.index_add_(0, rows, d)


class AdapterHeads(nn.Module):
    """The task head, with a replacement per adapter whose PEFT `modules_to_save` saved
    the classifier: each row runs the head of its request's adapter (base otherwise)."""

    def __init__(self, base: nn.Module, step: StepRows, per_request: bool) -> None:
        super().__init__()
        self.base = base
        self.step = step
        self.per_request = per_request
        self.heads: dict[int, nn.Module] = {}

    def add(self, slot: int, child: str, tensors: dict[str, torch.Tensor]) -> None:
        """A copy of the base head whose `child` (classifier / score) takes `tensors`."""
        head = copy.deepcopy(self.base)
        module = getattr(head, child, None)
        if module is None:
            raise ValueError(f"The adapter replaces {child!r}, but this model's head "
                             f"({type(self.base).__name__}) has no {child!r} module.")
        want = module.state_dict()
        if set(tensors) != set(want) or any(tensors[k].shape != want[k].shape for k in want):
            raise ValueError(
                f"The adapter's {child!r} tensors {_shapes(tensors)} do not match the "
                f"model's head {_shapes(want)} (same number of labels needed).")
        module.load_state_dict({k: v.to(want[k].dtype) for k, v in tensors.items()})
        self.heads[slot] = head.to(next(self.base.parameters()).device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        if not self.heads:
            return out
        slots = self.step.head_slots(x.shape[0], self.per_request)
        for slot, head in self.heads.items():
            rows = [i for i, s in enumerate(slots) if s == slot]
            if rows:
                out[rows] = head(x[rows])
        return out


def _shapes(tensors: dict[str, torch.Tensor]) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in sorted(tensors.items())}
