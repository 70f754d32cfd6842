"""The per-step LoRA add: `x @ A_i @ B_i * s_i` added to the rows of adapter i in a
projection's base output (no weight merge, base rows untouched).

A projection stacks the factors of the step's adapters that target it (A^T side by side,
B^T one above the other), so its LoRA term is two GEMMs whatever the number of adapters:
h = x @ [A_1 .. A_k], masked so each row keeps its own adapter's columns (`step.RowMap`),
then y += h @ [B_1; ..; B_k], added in the GEMM. The term is added before the layer's
activation; a residual add stays fused in the base GEMM.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import nn

from vllm.lora.step import RowMap, StepRows
from vllm.model_executor.layers.linear import GatedLinear, Linear, apply_activation

Stacked = tuple[torch.Tensor, object, tuple[int, ...]]  # A^T, B^T (or its halves), columns


class LoRALayer:
    """The adapters of one `Linear`: slot -> (A^T [in, r], s * B^T [r, out])."""

    def __init__(self, step: StepRows, layer: Linear) -> None:
        self.step = step
        self.gemm = layer.gemm  # the layer's bound GEMM runs the LoRA GEMMs too
        self.gated = isinstance(layer, GatedLinear)
        self.factors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._stacked: Optional[tuple[tuple[int, ...], Stacked]] = None

    def plan(self, x: torch.Tensor) -> Optional[tuple[RowMap, Stacked]]:
        """This step's plan for `x` (None: no row of it runs an adapter of this layer)."""
        rows = self.step.rows(x.shape[0])
        if rows is None:
            return None
        active = tuple(s for s in rows.slots if s in self.factors)
        return (rows, self._stack(active)) if active else None

    def _stack(self, active: tuple[int, ...]) -> Stacked:
        if self._stacked is None or self._stacked[0] != active:
            a = self._weight(torch.cat([self.factors[s][0] for s in active], 1))
            b = torch.cat([self.factors[s][1] for s in active], 0)
            b = tuple(self._weight(h) for h in b.chunk(2, dim=1)) if self.gated else \
                self._weight(b)
            cols = tuple(s for s in active for _ in range(self.factors[s][0].shape[1]))
            self._stacked = (active, (a, b, cols))
        return self._stacked[1]

    def _weight(self, t: torch.Tensor) -> torch.Tensor:
        """A [in, out] factor as the GEMM's weight ([out, in], packed where it packs)."""
        w = t.t().contiguous()
        packed = self.gemm.pack(w)
        return w if packed is None else packed

    def forward(self, layer: Linear, x: torch.Tensor, plan, residual=None,
                other=None) -> torch.Tensor:
        """The layer's output with each row's adapter term added before its epilogue."""
        rows, (a, b, cols) = plan
        h = self._low_rank(x, rows, a, cols)
        if isinstance(layer, GatedLinear):
            gate, up = layer.project(x)
            gate = self._add(gate, rows, h, b[0])
            up = self._add(up, rows, h, b[1])
            return apply_activation(layer.gate_activation, gate) * up
        if residual is not None and layer.activation is None:
            return self._add(layer.project(x, "add", residual), rows, h, b)
        y = self._add(layer.project(x), rows, h, b)
        if layer.activation is not None:
            y = apply_activation(layer.activation, y)
        if residual is not None:
            y += residual
        if other is not None:
            y *= other
        return y

    def _low_rank(self, x: torch.Tensor, rows: RowMap, a: torch.Tensor,
                  cols: tuple[int, ...]) -> torch.Tensor:
        """x's taken rows @ A^T, each row keeping only its own adapter's columns."""
        sel = rows.rows
        xs = x if sel is None else x[sel] if isinstance(sel, slice) else \
            x.index_select(0, sel)
        h = self.gemm.linear(xs, a, None, None)
        mask = rows.mask(cols, h.dtype)
        return h if mask is None else h.mul_(mask)

    def _add(self, y: torch.Tensor, rows: RowMap, h: torch.Tensor,
             b: torch.Tensor) -> torch.Tensor:
        """y + h @ B^T on the taken rows (in the GEMM's epilogue where all rows are)."""
        sel = rows.rows
        if sel is None:
            return self.gemm.linear_add(h, y, b, None)
        d = self.gemm.linear(h, b, None, None)
        if isinstance(sel, slice):
            y[sel] += d
        else:
            y.index_add_(0, sel, d)
        return y


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
