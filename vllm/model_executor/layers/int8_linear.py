"""int8 projections (`quantization="int8"`): weights per output channel at load,
activations per token at run time, the GEMM in int8.

A weight W [N, K] becomes q [N, K] int8 and scale [N] with W ~ q * scale[:, None]
(symmetric, round to nearest). At run time each input row x gets its own scale
max|x| / 127 (`quantize_rows`), the GEMM runs s8 x s8 -> s32 (`torch._int_mm`: oneDNN, on
VNNI or AMX-INT8 where the CPU has them: ~4x float32's rate), and one pass turns the int32
result back to float with the row and column scales, the bias and the epilogue (activation,
residual add, multiply: `dequantize_rows`). Both ends are C++ (csrc/int8_linear.cpp); where
the library is missing, torch ops compute the same thing, slower.

Only the backbone's `Linear` layers run in int8 (the model loader binds them); embeddings,
norms, attention (QK^T, softmax, PV), the pooler and every task head stay float: they are
a small share of the FLOPs, and the heads sit where an error is not averaged away.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

from vllm.model_executor.layers.skinny_gemm import MODES

# activations the dequantizing epilogue applies itself; the others run after it in torch
_FUSED = ("gelu", "silu", "relu")
_TORCH_ACT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu,
    "silu": F.silu}


class Int8Weight(NamedTuple):
    q: torch.Tensor      # [N, K] int8
    scale: torch.Tensor  # [N] float32


def quantize_weight(weight: torch.Tensor) -> Int8Weight:
    """Per output channel, symmetric: scale = max|W[n, :]| / 127 (a zero row keeps 0)."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127.0
    q = torch.round(w / scale.clamp_min(1e-30)[:, None]).clamp_(-127, 127).to(torch.int8)
    return Int8Weight(q.contiguous(), scale.contiguous())


def int8_gemm_exact() -> bool:
    """Whether `torch._int_mm` sums int8 products exactly at this thread count. oneDNN
    dispatched without int8 dot products (e.g. `ONEDNN_MAX_CPU_ISA=AVX2` on a VNNI CPU)
    adds pairs of products in int16 with saturation: 127 x 127 operands came back off by
    1.5 million, random ones by 45 thousand."""
    return _int_mm_exact(torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _int_mm_exact(threads: int) -> bool:
    g = torch.Generator().manual_seed(0)
    cases = [(torch.randint(-127, 128, (17, 96), generator=g, dtype=torch.int8),
              torch.randint(-127, 128, (96, 80), generator=g, dtype=torch.int8))]
    for a, b in ((127, 127), (127, -127), (-127, -127)):
        cases.append((torch.full((17, 96), a, dtype=torch.int8),
                      torch.full((96, 80), b, dtype=torch.int8)))
    try:
        return all(torch.equal(torch._int_mm(a, b).long(), a.long() @ b.long())
                   for a, b in cases)
    except RuntimeError:
        return False


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


class Int8Gemm:
    """The GEMM interface of `layers.linear` (`linear`, `linear_add`, `linear_mul`, `gated`,
    `pack`) on int8 weights; `kernels`: `cpu_kernels.int8_kernels()` or None (torch ops)."""

    name = "int8"

    def __init__(self, kernels: Optional[tuple[Callable, Callable]]) -> None:
        self.quantize, self.dequantize = kernels or (_quantize_torch, _dequantize_torch)

    pack = staticmethod(quantize_weight)

    def _run(self, x: torch.Tensor, w: Int8Weight, b, mode: Optional[str], other=None,
             quantized=None) -> torch.Tensor:
        lead, rows = x.shape[:-1], _rows(x)
        if rows.shape[0] == 0:
            return x.new_empty(*lead, w.q.shape[0])
        q, scales = quantized if quantized is not None else self.quantize(rows)
        acc = torch._int_mm(q, w.q.t())
        y = self.dequantize(acc, scales, w.scale, b, MODES[mode],
                            None if other is None else _rows(other))
        return y.view(*lead, y.shape[-1])

    def _act(self, x, w: Int8Weight, b, activation: Optional[str], quantized=None):
        if activation is None or activation in _FUSED:
            return self._run(x, w, b, activation, quantized=quantized)
        return _TORCH_ACT[activation](self._run(x, w, b, None, quantized=quantized))

    def linear(self, x, w: Int8Weight, b, activation: Optional[str]) -> torch.Tensor:
        return self._act(x, w, b, activation)

    def linear_add(self, x, residual, w: Int8Weight, b) -> torch.Tensor:
        return self._run(x, w, b, "add", residual)

    def linear_mul(self, x, other, w: Int8Weight, b) -> torch.Tensor:
        return self._run(x, w, b, "mul", other)

    def gated(self, x, w: tuple[Int8Weight, Int8Weight], activation: str = "silu"):
        """act(x @ gate.T) * (x @ up.T), x quantized once for both GEMMs."""
        gate, up = w
        rows = _rows(x)
        quantized = self.quantize(rows) if rows.shape[0] else None
        return self._run(x, up, None, "mul", self._act(x, gate, None, activation, quantized),
                         quantized=quantized)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, features] with unit column stride (a view where it can be)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(1) == 1 else rows.contiguous()
