"""RMSNorm as decoder checkpoints define it (normalised in float32).

Where the platform has a fused kernel for the model's dtype (CPU, float32 and bfloat16: the
one-pass C++ kernel in csrc/rms_norm.cpp, ~5x the torch ops below in float32, ~7x in
bfloat16; equal to them within float32 rounding, and within one bfloat16 ulp for a few
elements in a million), the model runner binds it once (`bind_rms_norm`). Otherwise it is
written out rather than `F.rms_norm`: the same operations in the same order as Hugging
Face's implementation (bit-identical to `F.rms_norm` in float32), and about a third faster
on CPU, where torch 2.13's `rms_norm` is not fused.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.kernel: Optional[Callable] = None  # f(x, weight, eps), set by bind_rms_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None and x.stride(-1) == 1 and x.dim() in (2, 3):
            return self.kernel(x, self.weight, self.eps)  # rows of unit stride (any layout)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if x.dtype == torch.float32:
            return h.mul_(self.weight)
        return self.weight * h.to(x.dtype)


def bind_rms_norm(model: nn.Module, kernel: Optional[Callable]) -> int:
    """Every `RMSNorm` of `model` runs `kernel` (None: torch ops); returns how many."""
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    for norm in norms:
        norm.kernel = kernel
    return len(norms)
