"""Dense projections on the fastest GEMM torch has for the device, with fused epilogues.

On x86 CPUs `F.linear` in float32 calls MKL's sgemm. On AMD CPUs MKL runs its AVX2 code
(about 210 GFLOP/s on the 2 Zen cores this was tuned on), while oneDNN, also inside torch
and reached through `torch.ops.mkldnn._linear_pointwise`, runs AVX-512 (about 460
GFLOP/s) and applies an activation, a residual add or a multiply in the GEMM's epilogue,
so those element-wise passes over [tokens x width] disappear. The backend is chosen once
per dtype by a self-check against `F.linear`; any other device or dtype, a torch without
oneDNN, or `VLLM_CPU_ONEDNN_LINEAR=0` uses plain `F.linear` and separate element-wise ops.

On that path the loaded model's weights are packed once (`pack_weights`) into oneDNN's
blocked layout, which oneDNN otherwise rebuilds from the plain [out, in] weight on every
call: that was 37% of a 9-token projection's time and 5-8% of an 1800-token one.
"""
from __future__ import annotations

import functools
import os
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

# activation name -> (oneDNN post-op, its algorithm, the same in plain torch)
_ACTIVATIONS: dict[str, tuple[str, str, Callable[[torch.Tensor], torch.Tensor]]] = {
    "gelu": ("gelu", "none", F.gelu),
    "gelu_tanh": ("gelu", "tanh", lambda x: F.gelu(x, approximate="tanh")),
    "relu": ("relu", "", F.relu),
    "silu": ("swish", "", F.silu),
}


def _onednn_op():
    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(torch.ops.mkldnn, "_linear_pointwise", None)


@functools.lru_cache(maxsize=None)
def onednn_linear_ok(dtype: torch.dtype) -> bool:
    """Whether CPU projections of this dtype go through oneDNN: it is built in, not turned
    off, and a small random GEMM with each epilogue matches `F.linear`."""
    if os.environ.get("VLLM_CPU_ONEDNN_LINEAR", "1") == "0":
        return False
    if dtype not in (torch.float32, torch.bfloat16) or _onednn_op() is None:
        return False
    g = torch.Generator().manual_seed(0)
    x, other = torch.randn(8, 64, generator=g), torch.randn(8, 48, generator=g)
    w, b = torch.randn(48, 64, generator=g), torch.randn(48, generator=g)
    ref = F.linear(x.double(), w.double(), b.double())
    x, other, w, b = (t.to(dtype) for t in (x, other, w, b))
    tol = 1e-3 if dtype == torch.float32 else 0.5
    try:
        with torch.inference_mode():
            packed = pack_weight(w)
            got = [_onednn(x, w, b, "gelu"), _onednn_binary(x, other, w, b, "add"),
                   _onednn_binary(x, other, w, b, "mul"), _onednn(x, packed, b, "gelu"),
                   _onednn_binary(x, other, packed, b, "add")]
        want = [F.gelu(ref), ref + other.double(), ref * other.double(), F.gelu(ref),
                ref + other.double()]
        return all(torch.allclose(a.double(), e, atol=tol, rtol=tol)
                   for a, e in zip(got, want))
    except (RuntimeError, TypeError):
        return False


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked copy of an [out, in] weight (an opaque mkldnn tensor that only the
    oneDNN GEMMs here accept)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def linear_backend(device: torch.device, dtype: torch.dtype) -> str:
    """'onednn' or 'torch': what the projections of a model on this device/dtype use."""
    return "onednn" if device.type == "cpu" and onednn_linear_ok(dtype) else "torch"


def _fast(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == weight.dtype and onednn_linear_ok(x.dtype)


def _onednn(x, w, b, activation: Optional[str]) -> torch.Tensor:
    attr, algorithm = ("none", "") if activation is None else _ACTIVATIONS[activation][:2]
    return _onednn_op()(x, w, b, attr, [], algorithm)


def _onednn_binary(x, other, w, b, op: str) -> torch.Tensor:
    """(x @ w.T + b) `op` other, the op ("add" or "mul") in the GEMM's epilogue."""
    return _onednn_op().binary(x, other, w, b, op)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: Optional[str] = None) -> torch.Tensor:
    """activation(x @ weight.T + bias)."""
    if _fast(x, weight):
        return _onednn(x.contiguous(), weight, bias, activation)
    y = F.linear(x, weight, bias)
    return y if activation is None else _ACTIVATIONS[activation][2](y)


def linear_add(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
               bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x @ weight.T + bias + residual (the residual connection after a projection)."""
    if _fast(x, weight) and residual.dtype == x.dtype:
        return _onednn_binary(x.contiguous(), residual.contiguous(), weight, bias, "add")
    return F.linear(x, weight, bias) + residual


def linear_mul(x: torch.Tensor, other: torch.Tensor, weight: torch.Tensor,
               bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(x @ weight.T + bias) * other (the up projection of a gated MLP)."""
    if _fast(x, weight) and other.dtype == x.dtype:
        return _onednn_binary(x.contiguous(), other.contiguous(), weight, bias, "mul")
    return F.linear(x, weight, bias) * other


def gated_silu(x: torch.Tensor, gate_up_weight: torch.Tensor) -> torch.Tensor:
    """silu(x @ gate.T) * (x @ up.T) for a fused [gate; up] weight without bias. With
    oneDNN that is two GEMMs whose epilogues apply the silu and the multiply."""
    i = gate_up_weight.shape[0] // 2
    if _fast(x, gate_up_weight):
        return _onednn_gated(x, gate_up_weight[:i], gate_up_weight[i:])
    gate, up = F.linear(x, gate_up_weight).chunk(2, dim=-1)
    return F.silu(gate) * up


def _onednn_gated(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(x @ gate.T) * (x @ up.T) as two oneDNN GEMMs (plain or packed weights)."""
    x = x.contiguous()
    return _onednn_binary(x, _onednn(x, gate, None, "silu"), up, None, "mul")


def check_activation(name: str) -> str:
    if name not in _ACTIVATIONS:
        raise ValueError(f"hidden_act {name!r} is not supported (supported: "
                         f"{', '.join(_ACTIVATIONS)})")
    return name


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, so checkpoints load unchanged) with an optional fused
    activation, and `forward_add` for a projection followed by a residual add."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 activation: Optional[str] = None) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.activation = None if activation is None else check_activation(activation)
        self.packed: Optional[torch.Tensor] = None  # set by pack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self._gemm_weight(), self.bias, self.activation)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """x @ W.T + b + residual; only for layers without an activation."""
        assert self.activation is None, "forward_add is for projections without activation"
        return linear_add(x, residual, self._gemm_weight(), self.bias)

    def _gemm_weight(self) -> torch.Tensor:
        return self.weight if self.packed is None else self.packed

    def pack(self) -> bool:
        """Keep the weight in oneDNN's blocked layout from now on (see the module
        docstring); False, and nothing changed, off the oneDNN path. The plain weight is
        released: the parameter becomes a meta tensor of the same shape and dtype, so any
        computation with it fails loudly (and the weight loaders refuse to copy into it)."""
        weight = self.weight
        if weight.is_meta:  # packed already
            return True
        if linear_backend(weight.device, weight.dtype) != "onednn":
            return False
        self._store_packed(weight)
        self.weight = nn.Parameter(torch.empty_like(weight, device="meta"),
                                   requires_grad=False)
        return True

    def _store_packed(self, weight: torch.Tensor) -> None:
        self.packed = pack_weight(weight)


class GatedLinear(Linear):
    """The fused [gate; up] projection of a gated MLP, without bias:
    forward(x) = silu(x @ gate.T) * (x @ up.T)."""

    def __init__(self, in_features: int, intermediate_size: int) -> None:
        super().__init__(in_features, 2 * intermediate_size, bias=False)
        self.halves: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # set by pack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.halves is None:
            return gated_silu(x, self.weight)
        gate, up = self.halves
        if not _fast(x, gate):
            raise RuntimeError("A packed GatedLinear runs on oneDNN only (CPU, its dtype).")
        return _onednn_gated(x, gate, up)

    def _store_packed(self, weight: torch.Tensor) -> None:
        i = weight.shape[0] // 2
        self.halves = (pack_weight(weight[:i]), pack_weight(weight[i:]))


def pack_weights(model: nn.Module) -> int:
    """Pack every `Linear` of a loaded model for oneDNN (see `Linear.pack`); returns how
    many were packed (0 off the oneDNN path)."""
    return sum(m.pack() for m in model.modules() if isinstance(m, Linear))
