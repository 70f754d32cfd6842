"""float32 projections on the C++ GEMM (csrc/f32_gemm.cpp), for CPUs where it is faster than
oneDNN's: an AVX2 build of the kernels (AVX2-only CPUs, or `VLLM_CPU_F32_GEMM=cpp`).

Under `ONEDNN_MAX_CPU_ISA=AVX2` on Zen 4, oneDNN ran MiniLM's projections at 183 GFLOP/s
(82% of the FMA peak) in the engine: its bias, GELU and residual epilogues cost about a
sixth. The kernel applies them, and a post-LN block's LayerNorm, to each register tile or
row before it is stored (benchmarks/README.md "Session 23" has the figures). On AVX-512
oneDNN runs at ~97% of peak and stays the default (`platforms.cpu.CpuPlatform.f32_gemm`).

The weight is packed once (`pack`): blocks of `kernel.block` output columns, each
[K][block] with its columns contiguous, the last block zero-padded. It is as large as the
plain weight, which `Linear.bind` then releases. That is the layout the few-row kernel
(layers.skinny_gemm) reads with kp = K, nb = block, so calls of at most 64 rows run it on
the same copy (`skinny_weight`): it streams the weight with a prefetch ahead, 1.08-1.16x
this GEMM at 9-64 rows of MiniLM's projections (AVX2 build, Zen 4).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from vllm.model_executor.layers.linear import TORCH
from vllm.model_executor.layers.skinny_gemm import MODES, SkinnyWeight

Norm = tuple[torch.Tensor, Optional[torch.Tensor], float]  # LayerNorm weight, bias, eps
# activations the kernel applies in its epilogue (others: a torch op after it)
KERNEL_ACTIVATIONS = ("gelu", "silu", "relu")
_TORCH_ACTIVATIONS = {"gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}


def pack(weight: torch.Tensor, block: int) -> torch.Tensor:
    """The plain float32 [n, k] `weight` as [ceil(n / block), k, block] (see the top)."""
    n, k = weight.shape
    blocks = -(-n // block)
    padded = torch.zeros(blocks * block, k, dtype=torch.float32)
    padded[:n] = weight.detach()
    return padded.view(blocks, block, k).transpose(1, 2).contiguous()


class PackedF32:
    """A packed weight and its output width (the packing pads it to whole blocks)."""

    def __init__(self, data: torch.Tensor, n: int) -> None:
        self.data, self.n = data, n


def skinny_weight(kernel: Callable, packed: "PackedF32",
                  weight: torch.Tensor) -> Optional[SkinnyWeight]:
    """The few-row kernel (`cpu_kernels.skinny_gemm_kernel()`) over a weight this module
    packed, where its tile width divides the block (a `skinny_gemm.SkinnyFactory`)."""
    if not isinstance(packed, PackedF32):
        return None
    blocks, k, block = packed.data.shape
    if block % kernel.tile_width:
        return None
    return SkinnyWeight(kernel, packed.data, packed.n, k, k, block)


class CppGemm:
    """The `Gemm` interface of layers.linear on the C++ float32 GEMM (`kernel`:
    `cpu_kernels.f32_gemm_kernel()`). A weight it did not pack (another dtype: `pack`
    refuses it, and the layer keeps its plain weight) runs on plain torch ops."""

    name = "cpp"

    def __init__(self, kernel: Callable) -> None:
        self.kernel = kernel

    def pack(self, w: torch.Tensor) -> Optional[PackedF32]:
        if w.dtype != torch.float32 or w.device.type != "cpu":
            return None
        return PackedF32(pack(w, self.kernel.block), w.shape[0])

    def _run(self, x: torch.Tensor, w: PackedF32, b: Optional[torch.Tensor], mode: Optional[str],
             other: Optional[torch.Tensor] = None, norm: Optional[Norm] = None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if other is not None:
            other = other.reshape(rows.shape[0], w.n)
        out = self.kernel(rows, w.data, w.n, b, MODES[mode], other, norm)
        return out.view(*x.shape[:-1], w.n)

    def linear(self, x, w: PackedF32, b, activation: Optional[str]) -> torch.Tensor:
        if not isinstance(w, PackedF32):
            return TORCH.linear(x, w, b, activation)
        if activation is None or activation in KERNEL_ACTIVATIONS:
            return self._run(x, w, b, activation)
        return _TORCH_ACTIVATIONS[activation](self._run(x, w, b, None))

    def linear_add(self, x, residual, w: PackedF32, b) -> torch.Tensor:
        if not isinstance(w, PackedF32):
            return TORCH.linear_add(x, residual, w, b)
        return self._run(x, w, b, "add", residual)

    def linear_mul(self, x, other, w: PackedF32, b) -> torch.Tensor:
        if not isinstance(w, PackedF32):
            return TORCH.linear_mul(x, other, w, b)
        return self._run(x, w, b, "mul", other)

    def linear_add_norm(self, x, residual, w: PackedF32, b, norm: Norm,
                        quantized=None) -> torch.Tensor:
        """LayerNorm(x @ w.T + b + residual) with norm = (weight, bias or None, eps): each
        row normed in the GEMM's pass (csrc/int8_dequantize.h layer_norm_row, as the int8
        kernels norm it)."""
        assert quantized is None, "quantized rows handed to a float32 projection"
        weight, bias, eps = norm
        if not isinstance(w, PackedF32):
            return F.layer_norm(TORCH.linear_add(x, residual, w, b), weight.shape, weight,
                                bias, eps)
        return self._run(x, w, b, "add", residual, (weight.detach(), None if bias is None
                                                    else bias.detach(), float(eps)))

    def gated(self, x, w: tuple[PackedF32, PackedF32], activation: str = "silu"
              ) -> torch.Tensor:
        """act(x @ gate.T) * (x @ up.T): the up projection's epilogue multiplies."""
        if not isinstance(w, tuple):
            return TORCH.gated(x, w, activation)
        gate, up = w
        return self._run(x, up, None, "mul", self.linear(x, gate, None, activation))


def kernel_matches_torch(gemm: CppGemm) -> bool:
    """The kernel on a weight that is not a whole number of blocks, K across its passes,
    every epilogue and the LayerNorm, against float64 torch (the platform asks, once)."""
    g = torch.Generator().manual_seed(0)
    n, k = 2 * gemm.kernel.block + 3, 1000
    w, b = torch.randn(n, k, generator=g) / 30, torch.randn(n, generator=g)
    nw, nb = torch.randn(n, generator=g), torch.randn(n, generator=g)
    packed = gemm.pack(w)
    for rows in (1, 7, 200):
        x, other = torch.randn(rows, k, generator=g), torch.randn(rows, n, generator=g)
        ref = F.linear(x.double(), w.double(), b.double())
        normed = F.layer_norm(ref + other.double(), (n,), nw.double(), nb.double(), 1e-5)
        pairs = [(gemm.linear(x, packed, b, None), ref),
                 (gemm.linear(x, packed, b, "gelu"), F.gelu(ref)),
                 (gemm.linear(x, packed, b, "silu"), F.silu(ref)),
                 (gemm.linear(x, packed, b, "relu"), F.relu(ref)),
                 (gemm.linear_add(x, other, packed, b), ref + other.double()),
                 (gemm.linear_mul(x, other, packed, b), ref * other.double()),
                 (gemm.linear_add_norm(x, other, packed, b, (nw, nb, 1e-5)), normed)]
        if not all(torch.allclose(got.double(), want, atol=1e-4, rtol=1e-4)
                   for got, want in pairs):
            return False
    return True
