"""LoRA on the Transformers backend: the transformers model's `nn.Linear` projections as
the engine's `Linear`, so the per-row LoRA add (vllm.lora) applies to them unchanged.

With `enable_lora` the backbone swaps every plain `nn.Linear` of its transformers model
for a `BackendLinear` holding the same parameters (`wrap_linears`; nothing is copied, the
GEMM stays torch's, so the base output is the one transformers computes). The LoRA layer
reads one row per token, in the step's flat layout, while transformers hands a projection
[1, T, in] (the flat step) or [B, W, in] (a whole-sequence step as one right-padded
batch). `RowLayout` says which rows are the step's tokens: all of them, or the padded
batch's unmasked positions (row-major, which is the flat order). Padding rows keep the
base output; attention never reads them.

PEFT names modules as transformers does, so an adapter's module is the `BackendLinear` at
that path (`lora_target`). Anything else it may name (GPT-2's `Conv1D`, fused MoE
experts, an embedding, the base model's first-token pooler) is refused by name.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.model_executor.layers.linear import Linear
from vllm.model_executor.lora_target import LoRATarget, UnsupportedTarget


class RowLayout:
    """The rows of a projection input that are the step's tokens (`index`: None = all)."""

    def __init__(self) -> None:
        self.index: Optional[torch.Tensor] = None
        self.total = 0  # rows of the padded batch (B * W)

    def padded(self, mask: Optional[torch.Tensor]) -> None:
        """A padded batch's attention mask [B, W] (None: back to the flat step)."""
        self.index = None if mask is None else mask.reshape(-1).nonzero().squeeze(1)
        self.total = 0 if mask is None else mask.numel()


class BackendLinear(Linear):
    """A transformers `nn.Linear` (its own parameters) that takes the step's LoRA add."""

    def __init__(self, linear: nn.Linear, layout: RowLayout) -> None:
        with torch.device("meta"):  # no weight allocated: the parameters are the original's
            super().__init__(linear.in_features, linear.out_features, linear.bias is not None)
        self.weight = linear.weight
        self.bias = linear.bias
        self.layout = layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plan = None
        if self.lora is not None:
            rows = x.reshape(-1, self.in_features)
            own = self._own_rows(rows)
            plan = self.lora.plan(own)
        if plan is None:
            return F.linear(x, self.weight, self.bias)
        out = self.lora.forward(self, own, plan)
        index = self.layout.index
        if index is not None:  # back into the padded batch; padding keeps the base output
            out = F.linear(rows, self.weight, self.bias).index_copy_(0, index, out)
        return out.reshape(*x.shape[:-1], self.out_features)

    def _own_rows(self, rows: torch.Tensor) -> torch.Tensor:
        index = self.layout.index
        if index is None:
            return rows
        if rows.shape[0] != self.layout.total:
            raise RuntimeError(f"LoRA: a projection saw {rows.shape[0]} rows of a padded "
                               f"batch of {self.layout.total}.")
        return rows.index_select(0, index)


def wrap_linears(root: nn.Module, layout: RowLayout) -> int:
    """Swap every plain `nn.Linear` under `root` for a `BackendLinear` (a module shared by
    several parents stays shared); returns how many were wrapped."""
    done: dict[int, BackendLinear] = {}
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                if id(child) not in done:
                    done[id(child)] = BackendLinear(child, layout)
                setattr(parent, name, done[id(child)])
    return len(done)


def lora_target(hf: nn.Module, module: str) -> LoRATarget:
    """The `BackendLinear` at PEFT's `module` (relative to the transformers base model)."""
    where = f"{type(hf).__name__} (Transformers backend)"
    if "pooler" in module.split("."):
        raise UnsupportedTarget(
            f"The LoRA adapter targets {module!r}, the base model's pooler, which runs on "
            f"the first token only; {where} takes LoRA on its per-token projections.")
    try:
        found = hf.get_submodule(module)
    except AttributeError:
        raise UnsupportedTarget(f"The LoRA adapter targets {module!r}, which is not a "
                                f"module of {where}.") from None
    if not isinstance(found, BackendLinear):
        raise UnsupportedTarget(
            f"The LoRA adapter targets {module!r}, a {type(found).__name__} of {where}; "
            "the Transformers backend applies LoRA to nn.Linear projections only (not to "
            "fused or custom projections such as GPT-2's Conv1D or fused MoE experts).")
    return LoRATarget("hf." + module, found, 0, found.out_features)
