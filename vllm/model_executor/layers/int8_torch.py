"""The float ends of the int8 projections in torch: rows quantized per token, int32 sums
back to float with the epilogue (csrc/int8_linear.cpp's formulas, for where the kernel
library is missing), and `gelu_q`, the GELU an int8 projection applies (its output is
rounded to int8 by the next projection)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from vllm.model_executor.layers.skinny_gemm import MODES

# activations the dequantizing epilogue applies itself; the others run after it in torch
_FUSED = ("gelu", "silu", "relu")
# An int8 projection's GELU output is rounded to int8 by the next projection (a step of
# max|row| / 127), so the epilogue runs csrc/simd.h's gelu_q (a polynomial erf, at most
# 3.6e-5 off for |x| <= 12): 16 operations instead of ~27 with a divide and an exp, where
# the GELU cost an int8 MiniLM pass ~7% (against ReLU's).
_EPILOGUE = {"gelu": "gelu_q"}
# csrc/simd.h's kGeluQ: erf(z) = z P(2 z^2 / 9 - 1), z clamped to [-3, 3]
_GELU_Q = (0.47012871503829956, -0.22872856259346008, 0.15759818255901337,
           -0.1111425831913948, 0.07214697450399399, -0.03973197191953659,
           0.024074608460068703, -0.01786532998085022, 0.006851510610431433)


def gelu_q(x: torch.Tensor) -> torch.Tensor:
    """The C++ epilogue's gelu_q in torch (float32 multiply-adds where the C++ runs FMAs:
    ~1e-6 apart)."""
    z = (x * 0.70710678118654752).clamp(-3.0, 3.0)
    s, p = z * z * (2.0 / 9.0) - 1.0, torch.full_like(x, _GELU_Q[8])
    for c in reversed(_GELU_Q[:8]):
        p = p * s + c
    half_x = x * 0.5
    return half_x * (z * p) + half_x


_TORCH_ACT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu,
    "silu": F.silu, "gelu_q": gelu_q}


def _quantize_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    amax = x.abs().amax(dim=1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return torch.round(x * inv[:, None]).to(torch.int8), amax / 127.0


def _dequantize_torch(acc, row_scales, col_scales, bias, mode: int, other=None):
    y = acc.float() * row_scales[:, None] * col_scales
    if bias is not None:
        y = y + bias
    name = next(k for k, v in MODES.items() if v == mode)
    if name == "add":
        return y + other
    if name == "mul":
        return y * other
    return y if name is None else _TORCH_ACT[name](y)
