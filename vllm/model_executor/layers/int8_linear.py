"""int8 projections (`quantization="int8"`): weights per output channel at load,
activations per token at run time, the GEMM in int8.

A weight W [N, K] becomes q [N, K] int8 and scale [N] with W ~ q * scale[:, None]
(symmetric, round to nearest). At run time each input row x gets its own scale
max|x| / 127 (`quantize_rows`), the GEMM runs s8 x s8 -> s32 (`torch._int_mm`: oneDNN, on
VNNI or AMX-INT8 where the CPU has them: ~4x float32's rate), and one pass turns the int32
result back to float with the row and column scales, the bias and the epilogue (activation,
residual add, multiply: `dequantize_rows`). Both ends are C++ (csrc/int8_linear.cpp); where
the library is missing, torch ops compute the same thing, slower.

Five paths, chosen at start-up by the CPU's features (`choose_path`, logged by the platform):
AMX and VNNI run the GEMM on oneDNN (`torch._int_mm`); AMX_FUSED (AMX-INT8, the default
there) runs it on csrc/int8_gemm_amx.cpp (tdpbssd tiles: exact int32 sums); VNNI_FUSED
(AVX512-VNNI without AMX, the default there) runs it on csrc/int8_gemm_vnni.cpp (`vpdpbusd`
on x + 128, less a per-column compensation made at load: exact int32 sums); AVX2 (no int8 dot products, e.g.
AMD Zen 2 / 3), where oneDNN's int8 GEMM saturates, runs it on csrc/int8_gemm_avx2.cpp
(x and w widened to int16, `vpmaddwd` pairs: exact int32 sums). The C++ kernels read
weights packed at load (`pack_avx2`) and fuse the dequantizing end into the same pass
(the same C++ formula as `dequantize_rows`), so their outputs are the VNNI path's bit for
bit. The C++ kernels can also quantize its output rows in that pass (`hidden`,
`gated_hidden`: an MLP's hidden rows, handed to the down projection's `linear_add` by
`linear.mlp_add`), the bytes `quantize_rows` would make of them, and then write no floats
(the down projection reads only those). A post-LN block's LayerNorm (`linear_add_norm`)
runs in the C++ kernels' pass; the oneDNN paths run the same C++ formula after
their GEMM (`layer_norm`), so every path keeps the same floats. `linear_bf16`: a
projection rounded to bfloat16 in the kernels' pass, for an attention that rounds its q/k/v
to bf16 anyway.

Only the backbone's `Linear` layers run in int8 (the model loader binds them); embeddings,
norms, attention (QK^T, softmax, PV), the pooler and every task head stay float: they are
a small share of the FLOPs, and the heads sit where an error is not averaged away. (Where
the CPU has AVX512-BF16, attention rounds q, k, v and its weights to bfloat16:
`Platform.int8_bf16_attention`.)
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

from vllm.model_executor.layers.int8_weights import (  # noqa: F401  (re-exported)
    Avx2Weight, Int8Weight, VnniWeight, column_compensation, pack_avx2, quantize_weight)
from vllm.model_executor.layers.linear import Quantized
from vllm.model_executor.layers.int8_torch import (  # noqa: F401  (re-exported)
    _EPILOGUE, _FUSED, _TORCH_ACT, _dequantize_torch, _quantize_torch, gelu_q)
from vllm.model_executor.layers.skinny_gemm import MODES

# a projection's float output and, where asked and made in the same pass, its rows quantized
Projected = tuple[torch.Tensor, Optional[Quantized]]
# a LayerNorm after a projection: (weight [N], bias [N] or None, eps)
Norm = tuple[torch.Tensor, Optional[torch.Tensor], float]


# /proc/cpuinfo flag -> name: the int8 dot products oneDNN's int8 GEMM needs to be exact
DOT_FLAGS = {"avx512_vnni": "AVX512-VNNI", "avx_vnni": "AVX-VNNI", "amx_int8": "AMX-INT8"}
PATH_CHOICES = ("auto", "avx2", "onednn", "vnni_fused", "amx_fused")  # VLLM_CPU_INT8_PATH
# Whether "auto" takes the fused VNNI kernel over oneDNN on AVX512-VNNI CPUs without AMX.
# MiniLM int8 embedding of 256 texts, same-run interleaved A/B on a 2-core Zen 5 shared with
# other jobs: at 2 threads 1.01-1.05x oneDNN's rate when the machine was quiet, 1.07-1.35x
# under load from other processes; at 1 thread 0.97-1.0x. The sums and floats are the same.
VNNI_FUSED_BY_DEFAULT = True
# Whether "auto" takes the fused AMX kernel over oneDNN's AMX GEMM on AMX-INT8 CPUs
# (benchmarks/README.md, session 19).
AMX_FUSED_BY_DEFAULT = True


class _Fused(NamedTuple):
    flag: str     # the /proc/cpuinfo flag "auto" needs
    unless: str   # a flag under which "auto" leaves it to another path ("" none)
    default: str  # the module constant that switches "auto" to it
    kernel: str   # how the log names it
    isa: str


_FUSED_PATHS = {
    "AMX_FUSED": _Fused("amx_int8", "", "AMX_FUSED_BY_DEFAULT",
                        "C++ AMX tdpbssd kernel", "AMX-INT8"),
    "VNNI_FUSED": _Fused("avx512_vnni", "amx_int8", "VNNI_FUSED_BY_DEFAULT",
                         "C++ vpdpbusd kernel", "AVX512-VNNI"),
}


def choose_path(flags: set[str], forced: str, onednn_exact: Callable[[], bool],
                avx2_missing: Callable[[], Optional[str]],
                vnni_missing: Callable[[], Optional[str]] = lambda: "not built",
                amx_missing: Callable[[], Optional[str]] = lambda: "not built"
                ) -> tuple[str, str]:
    """(path, why): "AMX_FUSED" / "VNNI_FUSED" (the C++ AMX-INT8 / AVX512-VNNI kernels;
    `amx_missing()` / `vnni_missing()`: why one cannot run, or None), "AMX" or "VNNI"
    (oneDNN's GEMM, where the CPU has int8 dot products and `torch._int_mm` is exact), else
    "AVX2" (the C++ kernel; `avx2_missing()` likewise). `forced`: one of PATH_CHOICES.
    Raises ValueError where no path can run."""
    if forced not in PATH_CHOICES:
        raise ValueError(f"VLLM_CPU_INT8_PATH={forced!r}: use one of {PATH_CHOICES}")
    missing = {"AMX_FUSED": amx_missing, "VNNI_FUSED": vnni_missing}
    for path in _FUSED_PATHS:
        fused = _fused(path, flags, forced, missing[path])
        if fused is not None:
            return fused
    dot = sorted(DOT_FLAGS[f] for f in flags & set(DOT_FLAGS))
    onednn = "AMX" if "amx_int8" in flags else "VNNI"
    if forced != "avx2":
        if dot and onednn_exact():
            return onednn, f"oneDNN int8 GEMM on {', '.join(dot)}"
        if forced == "onednn":
            raise ValueError(
                "VLLM_CPU_INT8_PATH=onednn: oneDNN's int8 GEMM needs int8 dot products "
                f"({', '.join(DOT_FLAGS.values())}); " + (
                    "this CPU has none of them" if not dot else "torch's oneDNN int8 GEMM is "
                    "not exact in this process (it saturates: oneDNN runs without int8 dot "
                    "products, e.g. under ONEDNN_MAX_CPU_ISA)") + ". Unset it to choose a "
                "path by the CPU's features.")
    why = "forced by VLLM_CPU_INT8_PATH=avx2" if forced == "avx2" else \
        "no int8 dot products on this CPU" if not dot else \
        "oneDNN's int8 GEMM saturates in this process (ONEDNN_MAX_CPU_ISA)"
    avx2 = avx2_missing()
    if avx2 is not None:
        raise ValueError(
            "quantization='int8' needs int8 dot products "
            f"({', '.join(DOT_FLAGS.values())}) or AVX2 with the C++ kernels; "
            f"{'this CPU has none of the former' if not dot else why} and the AVX2 kernel "
            f"is {avx2}. Leave quantization unset to run float32.")
    return "AVX2", f"C++ int16 vpmaddwd kernel, exact int32 sums; {why}"


def _fused(path: str, flags: set[str], forced: str,
           missing: Callable[[], Optional[str]]) -> Optional[tuple[str, str]]:
    """(path, why) for a fused C++ kernel ("AMX_FUSED" or "VNNI_FUSED") where
    VLLM_CPU_INT8_PATH names it, or "auto" takes it by default on a CPU with its flag (the
    VNNI kernel: not where AMX-INT8 is), and it can run; else None. Raises ValueError where
    it is forced and cannot run."""
    spec = _FUSED_PATHS[path]
    by_default = forced == "auto" and globals()[spec.default] and spec.flag in flags and \
        spec.unless not in flags
    if forced != path.lower() and not by_default:
        return None
    why = missing()
    if why is None:
        how = f"forced by VLLM_CPU_INT8_PATH={forced}" if forced != "auto" else spec.isa
        return path, f"{spec.kernel}, dequantized in its epilogue; {how}"
    if forced == path.lower():
        raise ValueError(f"VLLM_CPU_INT8_PATH={forced}: the {path.split('_')[0]} kernel is "
                         f"{why}. "
                         "Unset it to choose a path by the CPU's features.")
    return None


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


class Int8Gemm:
    """The GEMM interface of `layers.linear` (`linear`, `linear_add`, `linear_mul`, `gated`,
    `pack`) on int8 weights; `kernels`: `cpu_kernels.int8_kernels()` or None (torch ops).
    The int8 GEMM itself: oneDNN's (`torch._int_mm`), exact where the CPU has int8 dot
    products (path "VNNI" or "AMX")."""

    name = "int8"

    def __init__(self, kernels: Optional[tuple[Callable, Callable]],
                 path: str = "VNNI") -> None:
        self.quantize, self.dequantize = kernels or (_quantize_torch, _dequantize_torch)
        self.path = path

    pack = staticmethod(quantize_weight)

    def _project(self, q: torch.Tensor, scales: torch.Tensor, w: Int8Weight, b, mode: int,
                 other: Optional[torch.Tensor], keep: bool = False,
                 norm: Optional[Norm] = None, bf16: bool = False) -> Projected:
        """The int8 GEMM of quantized rows, back to float with the epilogue `mode`, and
        (`keep`, where the GEMM makes it in the same pass) the output's rows quantized.
        `norm`, `bf16`: only for GEMMs with `fused_norm` (each row layer-normed in the
        pass; rounded to bfloat16 there instead of written as floats)."""
        return self.dequantize(torch._int_mm(q, w.q.t()), scales, w.scale, b, mode,
                               other), None

    def _run(self, x: torch.Tensor, w: Int8Weight, b, mode: Optional[str], other=None,
             quantized: Optional[Quantized] = None, keep: bool = False,
             norm: Optional[Norm] = None, bf16: bool = False) -> Projected:
        lead, rows = x.shape[:-1], _rows(x)
        if rows.shape[0] == 0:
            return x.new_empty(*lead, w.scale.shape[0],
                               dtype=torch.bfloat16 if bf16 else x.dtype), None
        q, scales = quantized if quantized is not None else self.quantize(rows)
        y, kept = self._project(q, scales, w, b, MODES[_EPILOGUE.get(mode, mode)],
                                None if other is None else _rows(other), keep, norm, bf16)
        return y.view(*lead, y.shape[-1]), kept

    def _act(self, x, w: Int8Weight, b, activation: Optional[str], quantized=None,
             keep: bool = False) -> Projected:
        if activation is None or activation in _FUSED:
            return self._run(x, w, b, activation, quantized=quantized, keep=keep)
        y, _ = self._run(x, w, b, None, quantized=quantized)
        return _TORCH_ACT[activation](y), None

    def linear(self, x, w: Int8Weight, b, activation: Optional[str]) -> torch.Tensor:
        return self._act(x, w, b, activation)[0]

    def linear_add(self, x, residual, w: Int8Weight, b,
                   quantized: Optional[Quantized] = None) -> torch.Tensor:
        """`quantized`: x's rows as `hidden` handed them over (no pass over x)."""
        return self._run(x, w, b, "add", residual, quantized=quantized)[0]

    fused_norm = False  # whether `_project` applies a LayerNorm in the GEMM's own pass
    # f(x, weight, bias, eps): the C++ LayerNorm the fused kernels apply, for the paths that
    # normalise after the GEMM (the platform sets it), so all give the same floats; None:
    # F.layer_norm
    layer_norm: Optional[Callable] = None

    def linear_add_norm(self, x, residual, w: Int8Weight, b, norm: Norm,
                        quantized: Optional[Quantized] = None) -> torch.Tensor:
        """LayerNorm(x @ w.T + b + residual), norm = (weight [N], bias [N] or None, eps):
        in the GEMM's pass where it can (`fused_norm`: each whole row while it is in L1),
        else F.layer_norm after `linear_add`."""
        if self.fused_norm:
            return self._run(x, w, b, "add", residual, quantized=quantized, norm=norm)[0]
        y = self.linear_add(x, residual, w, b, quantized)
        if self.layer_norm is not None and y.dim() == 2 and y.shape[0]:
            return self.layer_norm(y, *norm)
        return F.layer_norm(y, (y.shape[-1],), norm[0], norm[1], norm[2])

    def linear_bf16(self, x, w: Int8Weight, b) -> torch.Tensor:
        """(x @ w.T + b) rounded to bfloat16, as `.to(torch.bfloat16)` rounds it: rounded in
        the GEMM's pass where it can (`fused_norm` kernels: no floats written), else after
        `linear`. For a projection whose only reader rounds to bf16 anyway (an int8
        model's bf16 attention)."""
        if self.fused_norm:
            return self._run(x, w, b, None, bf16=True)[0]
        return self.linear(x, w, b, None).to(torch.bfloat16)

    def linear_mul(self, x, other, w: Int8Weight, b) -> torch.Tensor:
        return self._run(x, w, b, "mul", other)[0]

    def gated(self, x, w: tuple[Int8Weight, Int8Weight], activation: str = "silu"):
        return self.gated_hidden(x, w, activation, keep=False)[0]

    def hidden(self, x, w: Int8Weight, b, activation: Optional[str]) -> Projected:
        """An MLP's hidden rows act(x @ w.T + b) and, where the GEMM quantizes them in the
        same pass, their quantization for the down projection (`linear_add(quantized=)`),
        or None. With the quantization the floats are not made (the fused kernels): the
        first element is then only their shape (zero-stride zeros)."""
        return self._act(x, w, b, activation, keep=True)

    def gated_hidden(self, x, w: tuple[Int8Weight, Int8Weight], activation: str = "silu",
                     keep: bool = True) -> Projected:
        """act(x @ gate.T) * (x @ up.T), x quantized once for both GEMMs; as `hidden`
        (`keep=False`: `gated`, whose caller reads only the floats)."""
        gate, up = w
        rows = _rows(x)
        quantized = self.quantize(rows) if rows.shape[0] else None
        gated, _ = self._act(x, gate, None, activation, quantized)
        return self._run(x, up, None, "mul", gated, quantized=quantized, keep=keep)


class Avx2Int8Gemm(Int8Gemm):
    """Int8Gemm with the GEMM on csrc/int8_gemm_avx2.cpp (`gemm`:
    `cpu_kernels.int8_gemm_avx2_kernel()`), for CPUs without int8 dot products: the same
    quantization, int32 sums and dequantization as the oneDNN path, so the same outputs."""

    def __init__(self, kernels: Optional[tuple[Callable, Callable]], gemm: Callable) -> None:
        super().__init__(kernels, "AVX2")
        self.gemm = gemm
        self.fused_norm = getattr(gemm, "fused", False)

    def pack(self, weight: torch.Tensor) -> Avx2Weight:
        w = quantize_weight(weight)
        return Avx2Weight(pack_avx2(w.q, self.gemm.block, group=self.gemm.group), w.scale)

    def _gemm(self, q: torch.Tensor, scales: torch.Tensor, w: Avx2Weight, b, mode: int,
              other: Optional[torch.Tensor], **fused):
        return self.gemm(q, w.packed, w.scale.shape[0], scales, w.scale, b, mode, other,
                         **fused)

    def _project(self, q: torch.Tensor, scales: torch.Tensor, w: Avx2Weight, b, mode: int,
                 other: Optional[torch.Tensor], keep: bool = False,
                 norm: Optional[Norm] = None, bf16: bool = False) -> Projected:
        """The GEMM and the dequantizing end in one kernel pass (no int32 [M, N] in memory):
        the floats of `dequantize_rows`. Where the kernel has the fused float end
        (`fused_norm`): `keep`, each output row quantized while it is in L1 (the down
        projection's input; otherwise a pass over [M, N] floats in memory: MiniLM's [8155,
        1536] hidden rows, 1.5 ms per layer), no floats written (the down projection reads
        only the quantized rows): the floats returned are a stand-in with their shape
        (zero-stride zeros); `norm`, each row layer-normed in the same pass; `bf16`, the
        rows rounded to bfloat16 there."""
        if not self.fused_norm:
            return self._gemm(q, scales, w, b, mode, other), None
        out = self._gemm(q, scales, w, b, mode, other, quantized=keep, floats=not keep,
                         norm=norm, out_dtype=torch.bfloat16 if bf16 else torch.float32)
        return (out[0], out[1:]) if keep else (out, None)


class VnniInt8Gemm(Avx2Int8Gemm):
    """Int8Gemm with the GEMM on csrc/int8_gemm_vnni.cpp (`gemm`:
    `cpu_kernels.int8_gemm_vnni_kernel()`, AVX512-VNNI `vpdpbusd`) and the dequantizing end
    fused into it: the same int32 sums and floats as the oneDNN path, with no int32 [M, N]
    in memory."""

    def __init__(self, kernels: Optional[tuple[Callable, Callable]], gemm: Callable) -> None:
        super().__init__(kernels, gemm)
        self.path, self.fused_norm = "VNNI_FUSED", True

    def pack(self, weight: torch.Tensor) -> VnniWeight:
        w = quantize_weight(weight)
        return VnniWeight(pack_avx2(w.q, self.gemm.block),
                          column_compensation(w.q, self.gemm.block), w.scale)

    def _gemm(self, q: torch.Tensor, scales: torch.Tensor, w: VnniWeight, b, mode: int,
              other: Optional[torch.Tensor], **fused):
        return self.gemm(q, w.packed, w.comp, w.scale.shape[0], scales, w.scale, b, mode,
                         other, **fused)


class AmxInt8Gemm(Avx2Int8Gemm):
    """Int8Gemm with the GEMM on csrc/int8_gemm_amx.cpp (`gemm`:
    `cpu_kernels.int8_gemm_amx_kernel()`, AMX-INT8 tiles, s8 x s8) and the dequantizing end
    fused into it, as VnniInt8Gemm: the same int32 sums and floats as the oneDNN path. The
    packed weight keeps `AMX_SLACK` zero bytes after it (the last tile reads on)."""

    def __init__(self, kernels: Optional[tuple[Callable, Callable]], gemm: Callable) -> None:
        super().__init__(kernels, gemm)
        self.path, self.fused_norm = "AMX_FUSED", True

    def pack(self, weight: torch.Tensor) -> Avx2Weight:
        w = quantize_weight(weight)
        return Avx2Weight(pack_avx2(w.q, self.gemm.block, self.gemm.slack), w.scale)



def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, features] with unit column stride (a view where it can be)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(1) == 1 else rows.contiguous()
