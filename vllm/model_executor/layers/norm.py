"""RMSNorm as decoder checkpoints define it (normalised in float32).

Written out rather than `F.rms_norm`: the same operations in the same order as Hugging
Face's implementation (bit-identical to `F.rms_norm` in float32), and about a third faster
on CPU, where torch 2.13's `rms_norm` is not fused.
"""
import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if x.dtype == torch.float32:
            return h.mul_(self.weight)
        return self.weight * h.to(x.dtype)
