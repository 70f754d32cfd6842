"""Dense projections bound once, when the model is built, to the GEMM its platform chose.

On x86 CPUs `F.linear` in float32 calls MKL's sgemm. On AMD CPUs MKL runs its AVX2 code
(about 210 GFLOP/s on the 2 Zen cores this was tuned on), while oneDNN, also inside torch
and reached through `torch.ops.mkldnn._linear_pointwise`, runs AVX-512 (about 460
GFLOP/s) and applies an activation, a residual add or a multiply in the GEMM's epilogue,
so those element-wise passes over [tokens x width] disappear. The CPU platform picks
`ONEDNN` once per dtype when it passes a self-check against `F.linear` (and
`VLLM_CPU_ONEDNN_LINEAR` is not 0); every other case uses `TORCH` (plain `F.linear` and
separate element-wise ops; cuBLAS on CUDA). Where the C++ kernels are an AVX2 build (CPUs
without AVX-512, whose oneDNN GEMM falls further short of the FMA peak), float32 binds the
C++ GEMM of `layers.f32_gemm` instead, which has this module's `Gemm` interface.

`bind(impl)` sets a layer's implementation and, for `ONEDNN`, packs its weight once into
oneDNN's blocked layout, which oneDNN otherwise rebuilds from the plain [out, in] weight on
every call: that was 37% of a 9-token projection's time and 5-8% of an 1800-token one.
A layer nobody bound runs `TORCH`, so a model built by hand still computes correctly.
Where the platform offers it (float32, AVX2 or AVX-512), a packed layer also gets a `SkinnyWeight`: a
call of at most `skinny_gemm.MAX_ROWS` rows runs that C++ kernel over the same packed weight.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from vllm.model_executor.layers.packed import pack_weight
from vllm.model_executor.layers.skinny_gemm import ACTIVATIONS as SKINNY_ACTIVATIONS
from vllm.model_executor.layers.skinny_gemm import SkinnyWeight

# activation name -> (oneDNN post-op, its algorithm, the same in plain torch)
_ACTIVATIONS: dict[str, tuple[str, str, Callable[[torch.Tensor], torch.Tensor]]] = {
    "gelu": ("gelu", "none", F.gelu),
    "gelu_tanh": ("gelu", "tanh", lambda x: F.gelu(x, approximate="tanh")),
    "relu": ("relu", "", F.relu),
    "silu": ("swish", "", F.silu),
}
Weight = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]
# rows quantized per row: (int8 [M, K], float32 scales [M]) (layers/int8_linear.py)
Quantized = tuple[torch.Tensor, torch.Tensor]
# (packed weight, the plain [out, in] weight it was packed from) -> a few-row kernel
# reading it, or None
SkinnyFactory = Callable[[torch.Tensor, torch.Tensor], Optional["SkinnyWeight"]]


def _onednn_op():
    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(torch.ops.mkldnn, "_linear_pointwise", None)


@functools.lru_cache(maxsize=None)
def onednn_linear_ok(dtype: torch.dtype) -> bool:
    """Whether oneDNN can run CPU projections of this dtype: it is built in, and a small
    random GEMM with each epilogue matches `F.linear` (the CPU platform asks, once)."""
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


def _onednn(x, w, b, activation: Optional[str]) -> torch.Tensor:
    attr, algorithm = ("none", "") if activation is None else _ACTIVATIONS[activation][:2]
    return _onednn_op()(x, w, b, attr, [], algorithm)


def _onednn_binary(x, other, w, b, op: str) -> torch.Tensor:
    """(x @ w.T + b) `op` other, the op ("add" or "mul") in the GEMM's epilogue."""
    return _onednn_op().binary(x, other, w, b, op)


class TorchGemm:
    """F.linear and separate element-wise ops (any device, any dtype)."""

    name = "torch"

    @staticmethod
    def linear(x, w, b, activation: Optional[str]) -> torch.Tensor:
        y = F.linear(x, w, b)
        return y if activation is None else _ACTIVATIONS[activation][2](y)

    @staticmethod
    def linear_add(x, residual, w, b) -> torch.Tensor:
        return F.linear(x, w, b) + residual

    @staticmethod
    def linear_mul(x, other, w, b) -> torch.Tensor:
        return F.linear(x, w, b) * other

    @staticmethod
    def gated(x, w: Weight, activation: str = "silu") -> torch.Tensor:
        gate, up = F.linear(x, w).chunk(2, dim=-1)
        return _ACTIVATIONS[activation][2](gate) * up

    @staticmethod
    def pack(w: torch.Tensor) -> Optional[torch.Tensor]:
        return None  # plain weights


class OneDnnGemm:
    """oneDNN GEMMs with the activation / residual add / multiply in the epilogue (CPU)."""

    name = "onednn"

    @staticmethod
    def linear(x, w, b, activation: Optional[str]) -> torch.Tensor:
        return _onednn(x.contiguous(), w, b, activation)

    @staticmethod
    def linear_add(x, residual, w, b) -> torch.Tensor:
        return _onednn_binary(x.contiguous(), residual.contiguous(), w, b, "add")

    @staticmethod
    def linear_mul(x, other, w, b) -> torch.Tensor:
        return _onednn_binary(x.contiguous(), other.contiguous(), w, b, "mul")

    @staticmethod
    def gated(x, w: Weight, activation: str = "silu") -> torch.Tensor:
        """act(x @ gate.T) * (x @ up.T) as two GEMMs whose epilogues apply the activation
        and the multiply (`w`: the fused [gate; up] weight, or its packed halves)."""
        gate, up = w if isinstance(w, tuple) else w.chunk(2, dim=0)
        x = x.contiguous()
        return _onednn_binary(x, _onednn(x, gate, None, activation), up, None, "mul")

    pack = staticmethod(lambda w: pack_weight(w))


TORCH, ONEDNN = TorchGemm(), OneDnnGemm()
GEMMS = {g.name: g for g in (TORCH, ONEDNN)}
# also layers.f32_gemm.CppGemm, the same interface (not named here: it imports this module)
Gemm = Union[TorchGemm, OneDnnGemm]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: Optional[str] = None) -> torch.Tensor:
    """activation(x @ weight.T + bias) with plain torch ops, for a projection that is not a
    bound `Linear` (e.g. a head over a handful of pooled rows)."""
    return TORCH.linear(x, weight, bias, activation)


def apply_activation(name: str, x: torch.Tensor) -> torch.Tensor:
    """The named activation (see `check_activation`) as a separate torch op."""
    return _ACTIVATIONS[name][2](x)


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
        self.gemm: Gemm = TORCH  # set by bind()
        self.packed: Optional[Weight] = None  # set by bind() where the GEMM packs
        # set by bind() where a few-row kernel reads the packed weight (layers.skinny_gemm)
        self.skinny: Optional[Union[SkinnyWeight, tuple[SkinnyWeight, SkinnyWeight]]] = None
        # vllm.lora.layers.LoRALayer where an adapter targets this projection: rows of a
        # step under an adapter get its term added before the epilogue (no weight merge).
        self.lora = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lora is not None and (plan := self.lora.plan(x)):
            return self.lora.forward(self, x, plan)
        if self.skinny is not None and self.skinny.takes(x):
            return _skinny_activation(self.skinny, x, self.bias, self.activation)
        return self.gemm.linear(x, self._gemm_weight(), self.bias, self.activation)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor,
                    quantized: Optional[Quantized] = None) -> torch.Tensor:
        """x @ W.T + b + residual; only for layers without an activation. `quantized`: x's
        rows as an up projection's `forward_hidden` handed them over."""
        assert self.activation is None, "forward_add is for projections without activation"
        if quantized is not None:  # x may be a stand-in with only its shape (Int8Gemm.hidden)
            assert hasattr(self.gemm, "hidden"), "quantized rows handed to a projection " \
                "not on an int8 GEMM"
            return self.gemm.linear_add(x, residual, self._gemm_weight(), self.bias, quantized)
        if self.lora is not None and (plan := self.lora.plan(x)):
            return self.lora.forward(self, x, plan, residual=residual)
        if self.skinny is not None and self.skinny.takes(x):
            return self.skinny(x, self.bias, "add", residual)
        return self.gemm.linear_add(x, residual, self._gemm_weight(), self.bias)

    def forward_add_norm(self, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module,
                         quantized: Optional[Quantized] = None) -> torch.Tensor:
        """norm(x @ W.T + b + residual), a post-LN block's end: where `norm` is a LayerNorm
        over the output and the bound GEMM has `linear_add_norm` (int8 and the C++ float32
        GEMM: in its own pass on the C++ kernels, each row while it is in L1 or L2; the same
        C++ formula after the GEMM on the oneDNN int8 paths), that; else `forward_add`,
        then `norm`."""
        fused = hasattr(self.gemm, "linear_add_norm") and isinstance(norm, nn.LayerNorm) \
            and norm.weight is not None and norm.weight.dtype == torch.float32 \
            and tuple(norm.normalized_shape) == (self.out_features,) \
            and (quantized is not None or (self.lora is None and self.skinny is None))
        if not fused:
            return norm(self.forward_add(x, residual, quantized))
        return self.gemm.linear_add_norm(x, residual, self._gemm_weight(), self.bias,
                                         (norm.weight, norm.bias, norm.eps), quantized)

    def forward_bf16(self, x: torch.Tensor) -> torch.Tensor:
        """forward(x).to(torch.bfloat16), for a projection whose only reader rounds its
        output to bf16 anyway (an int8 model's bf16 attention: `Attention.rounds_to_bf16`):
        rounded in the bound GEMM's own pass where it can (int8, the C++ kernels: no
        floats written), the same values."""
        if hasattr(self.gemm, "linear_bf16") and self.activation is None and \
                self.lora is None and self.skinny is None:
            return self.gemm.linear_bf16(x, self._gemm_weight(), self.bias)
        return self(x).to(torch.bfloat16)

    def forward_hidden(self, x: torch.Tensor) -> tuple[torch.Tensor, Optional[Quantized]]:
        """An MLP's up projection: forward(x), and where the bound GEMM quantizes its output
        in the same pass (int8, the C++ kernels) those rows for the down
        projection's `forward_add(quantized=)`, else None. With them the floats are a
        stand-in of their shape only (the kernel writes none: the down projection reads
        the quantized rows)."""
        if self._hands_over(x):
            return self.gemm.hidden(x, self._gemm_weight(), self.bias, self.activation)
        return self(x), None

    def _hands_over(self, x: torch.Tensor) -> bool:
        """x takes the bound GEMM's own path, and that GEMM has `hidden` (Int8Gemm)."""
        return (hasattr(self.gemm, "hidden") and self.skinny is None
                and (self.lora is None or not self.lora.plan(x)))

    def forward_mul(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """(x @ W.T + b) * other; only for layers without an activation."""
        assert self.activation is None, "forward_mul is for projections without activation"
        if self.lora is not None and (plan := self.lora.plan(x)):
            return self.lora.forward(self, x, plan, other=other)
        if self.skinny is not None and self.skinny.takes(x):
            return self.skinny(x, self.bias, "mul", other)
        return self.gemm.linear_mul(x, other, self._gemm_weight(), self.bias)

    def project(self, x: torch.Tensor, mode: Optional[str] = None,
                other: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x @ W.T + b on the bound GEMM without the activation (LoRA adds before it);
        `mode` "add": + other, in the GEMM's epilogue."""
        if self.skinny is not None and self.skinny.takes(x):
            return self.skinny(x, self.bias, mode, other)
        if mode == "add":
            return self.gemm.linear_add(x, other, self._gemm_weight(), self.bias)
        return self.gemm.linear(x, self._gemm_weight(), self.bias, None)

    def _gemm_weight(self) -> Weight:
        return self.weight if self.packed is None else self.packed

    def bind(self, gemm: Gemm, skinny: Optional[SkinnyFactory] = None) -> bool:
        """Run on `gemm` from now on (call after the weights are loaded, on the final
        device and dtype); True if the weight was packed for it. A packed layer's plain
        weight is released: the parameter becomes a meta tensor of the same shape and
        dtype, so any computation with it fails loudly (and the weight loaders refuse to
        copy into it). Binding a packed layer again keeps its packing. `skinny(packed,
        weight)`: a few-row kernel over a packed weight, used up to its row limit where it
        reads this layer's layout (checked against the plain weight, before release)."""
        if self.packed is not None:
            return True
        self.gemm = gemm
        weight = self.weight
        packed = self._pack(gemm, weight)
        if packed is None:
            return False
        self.packed = packed
        if skinny is not None:
            self.skinny = self._skinny(skinny, packed, weight)
        self.weight = nn.Parameter(torch.empty_like(weight, device="meta"),
                                   requires_grad=False)
        return True

    def _pack(self, gemm: Gemm, weight: torch.Tensor) -> Optional[Weight]:
        return gemm.pack(weight)

    def _skinny(self, skinny: SkinnyFactory, packed: Weight, weight: torch.Tensor):
        return skinny(packed, weight)


class GatedLinear(Linear):
    """The fused [gate; up] projection of a gated MLP, without bias:
    forward(x) = act(x @ gate.T) * (x @ up.T), act silu (SwiGLU) unless told otherwise
    (ModernBERT's GeGLU: gelu)."""

    def __init__(self, in_features: int, intermediate_size: int,
                 activation: str = "silu") -> None:
        super().__init__(in_features, 2 * intermediate_size, bias=False)
        self.gate_activation = check_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lora is not None and (plan := self.lora.plan(x)):
            return self.lora.forward(self, x, plan)
        if self.skinny is not None and self.skinny[0].takes(x):
            gate, up = self.skinny
            return up(x, None, "mul", _skinny_activation(gate, x, None, self.gate_activation))
        return self.gemm.gated(x, self._gemm_weight(), self.gate_activation)

    def forward_hidden(self, x: torch.Tensor) -> tuple[torch.Tensor, Optional[Quantized]]:
        if self._hands_over(x):
            return self.gemm.gated_hidden(x, self._gemm_weight(), self.gate_activation)
        return self(x), None

    def project(self, x: torch.Tensor, mode: Optional[str] = None,  # type: ignore[override]
                other: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x @ gate.T, x @ up.T) on the bound GEMM, before the activation and product."""
        if self.skinny is not None and self.skinny[0].takes(x):
            return self.skinny[0](x, None), self.skinny[1](x, None)
        w = self._gemm_weight()
        gate, up = w if isinstance(w, tuple) else w.chunk(2, dim=0)
        return self.gemm.linear(x, gate, None, None), self.gemm.linear(x, up, None, None)

    def _pack(self, gemm: Gemm, weight: torch.Tensor) -> Optional[Weight]:
        gate, up = weight.chunk(2, dim=0)
        halves = gemm.pack(gate), gemm.pack(up)
        return None if halves[0] is None else halves

    def _skinny(self, skinny: SkinnyFactory, packed: Weight, weight: torch.Tensor):
        halves = tuple(skinny(p, w) for p, w in zip(packed, weight.chunk(2, dim=0)))
        return None if None in halves else halves


def _skinny_activation(weight: SkinnyWeight, x: torch.Tensor, bias: Optional[torch.Tensor],
                       activation: Optional[str]) -> torch.Tensor:
    """activation(x @ W.T + bias) on the few-row kernel, in its epilogue where it has it."""
    if activation is None or activation in SKINNY_ACTIVATIONS:
        return weight(x, bias, activation)
    return _ACTIVATIONS[activation][2](weight(x, bias))


def mlp_add(up: Linear, down: Linear, x: torch.Tensor, residual: torch.Tensor,
            norm: Optional[nn.Module] = None) -> torch.Tensor:
    """residual + down(up(x)) (then `norm` of it: a post-LN block), the hidden rows handed
    from one projection to the next as the bound GEMM prefers (int8: quantized in the up
    projection's own pass), the norm in the down projection's pass where it can."""
    hidden, quantized = up.forward_hidden(x)
    if norm is not None:
        return down.forward_add_norm(hidden, residual, norm, quantized)
    return down.forward_add(hidden, residual, quantized)


def bind_linear(model: nn.Module, gemm: Gemm, skinny: Optional[SkinnyFactory] = None) -> int:
    """Bind every `Linear` of a loaded model to `gemm` (see `Linear.bind`); returns how many
    weights were packed (0 for GEMMs that use plain weights)."""
    return sum(m.bind(gemm, skinny) for m in model.modules() if isinstance(m, Linear))
