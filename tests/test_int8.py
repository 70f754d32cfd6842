"""quantization="int8": per-token activations x per-channel weights on torch._int_mm, with
the C++ ends (csrc/int8_linear.cpp) equal to their torch form, every GEMM entry point exact
against the same quantized values in float64, models within cosine 0.99 of float32, and a
CPU with neither int8 dot products nor AVX2 refused with a clear error (the AVX2 path:
tests/test_int8_avx2.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vllm._kernels import cpu_kernels
from vllm.model_executor.layers import int8_linear as i8
from vllm.platforms.cpu import INT8_FLAGS

HAS_INT8_DOT = bool(cpu_kernels.cpu_flags() & set(INT8_FLAGS))
# oneDNN under ONEDNN_MAX_CPU_ISA=AVX2 on a VNNI CPU: its int8 GEMM saturates (refused below)
EXACT_INT_MM = i8.int8_gemm_exact()


def _int8_refusal() -> str:
    """Why quantization="int8" cannot run in this process on any path ('' where it can)."""
    from vllm.platforms import current_platform
    try:
        current_platform.int8_path()
    except ValueError as exc:
        return str(exc)
    return ""


# int8 on whichever path this CPU takes (VNNI / AMX on oneDNN or the C++ VNNI kernel, else
# the C++ AVX2 kernel: under ONEDNN_MAX_CPU_ISA=AVX2 these model tests run that one)
needs_int8 = pytest.mark.skipif(bool(_int8_refusal()), reason=_int8_refusal() or "-")
needs_exact_int_mm = pytest.mark.skipif(not EXACT_INT_MM, reason="torch's int8 GEMM is not "
                                        "exact in this process (ONEDNN_MAX_CPU_ISA)")
SIMD = {"avx512f"} <= cpu_kernels.cpu_flags() or {"avx2", "fma"} <= cpu_kernels.cpu_flags()


@pytest.fixture(scope="module")
def kernels():
    """The C++ ends of this build; a missing build fails (it is built at install)."""
    if not SIMD:
        pytest.skip("the int8 kernels need an AVX2 or AVX-512 CPU")
    found = cpu_kernels.int8_kernels()
    assert found is not None, cpu_kernels.kernel_status("int8")
    return found


@pytest.mark.parametrize("m,k", [(1, 384), (7, 40), (33, 1536), (5, 19)])
def test_quantize_rows_equals_torch(kernels, m, k):
    g = torch.Generator().manual_seed(m * k)
    x = torch.randn(m, k + 3, generator=g)[:, 1:k + 1] * 3   # strided rows, as models pass
    x[-1] = 0.0                                                # a zero row: scale 0, q 0
    q, s = kernels[0](x)
    q_ref, s_ref = i8._quantize_torch(x)
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
    assert q.dtype == torch.int8 and not q[-1].any() and s[-1] == 0
    assert (q[:-1].abs().amax(1) == 127).all()
    assert (q.float() * s[:, None] - x).abs().max() <= s.max() / 2 + 1e-6


@pytest.mark.parametrize("mode", list(i8.MODES))
@pytest.mark.parametrize("n", [1152, 100, 7])
def test_dequantize_rows_equals_torch(kernels, mode, n):
    g = torch.Generator().manual_seed(n)
    m = 9
    acc = torch.randint(-40000, 40000, (m, n), generator=g, dtype=torch.int32)
    rs, cs = torch.rand(m, generator=g) * 1e-4, torch.rand(n, generator=g)
    other = torch.randn(m, n + 2, generator=g)[:, :n]
    for bias in (torch.randn(n, generator=g), None):
        got = kernels[1](acc, rs, cs, bias, i8.MODES[mode],
                         other if mode in ("add", "mul") else None)
        want = i8._dequantize_torch(acc, rs, cs, bias, i8.MODES[mode], other)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_int8_gelu_is_gelu_within_5e_5_and_the_same_in_every_column(kernels):
    """An int8 projection's GELU (gelu_q, rounded to int8 by the next projection) is torch's
    erf GELU to 5e-5 for |x| <= 12; the C++ epilogue gives the same floats in a vector's
    column and in a scalar tail's, and the torch fallback's to 1e-6."""
    x = torch.linspace(-12, 12, 240001)
    assert (i8.gelu_q(x).double() - F.gelu(x.double())).abs().max() < 5e-5
    acc = torch.arange(-12000, 12001, dtype=torch.int32)[:, None].repeat(1, 17)
    ones = torch.ones(17)
    got = kernels[1](acc, torch.full((acc.shape[0],), 1e-3), ones, None, i8.MODES["gelu_q"],
                     None)
    assert torch.equal(got[:, 0], got[:, 16])  # vector column, scalar tail (16 + 1 columns)
    y = acc[:, 0].float() * (1e-3 * 1.0)
    assert (got[:, 0].double() - F.gelu(y.double())).abs().max() < 5e-5
    torch.testing.assert_close(got[:, 0], i8.gelu_q(y), atol=1e-6, rtol=1e-6)
    assert torch.isnan(i8.gelu_q(torch.tensor([float("nan")]))).all()


def _exact(x, w: i8.Int8Weight, b):
    """The same quantized operands in float64: what the int8 path must give to rounding."""
    q, s = i8._quantize_torch(x.reshape(-1, x.shape[-1]).contiguous())
    y = (q.double() * s.double()[:, None]) @ (w.q.double() * w.scale.double()[:, None]).t()
    return y if b is None else y + b.double()


@pytest.mark.parametrize("use_kernels", [True, False])
@needs_exact_int_mm
def test_every_gemm_entry_point_is_exact_on_the_quantized_values(kernels, use_kernels):
    gemm = i8.Int8Gemm(kernels if use_kernels else None)
    g = torch.Generator().manual_seed(1)
    for rows in (1, 9, 70):
        x = torch.randn(rows, 96, generator=g)
        w, b = torch.randn(80, 96, generator=g) / 10, torch.randn(80, generator=g)
        other = torch.randn(rows, 80, generator=g)
        pw = gemm.pack(w)
        ref = _exact(x, pw, b)
        got = {"plain": gemm.linear(x, pw, b, None), "gelu": gemm.linear(x, pw, b, "gelu"),
               "tanh": gemm.linear(x, pw, b, "gelu_tanh"),
               "add": gemm.linear_add(x, other, pw, b), "mul": gemm.linear_mul(x, other, pw, b)}
        want = {"plain": ref, "gelu": F.gelu(ref), "tanh": F.gelu(ref, approximate="tanh"),
                "add": ref + other.double(), "mul": ref * other.double()}
        for name in got:
            torch.testing.assert_close(got[name].double(), want[name], atol=1e-4, rtol=1e-4,
                                       msg=lambda m: f"{name}: {m}")
        # and close to float32 itself: per-token x per-channel int8 loses ~1% per GEMM
        exact = F.linear(x.double(), w.double(), b.double())
        assert (got["plain"].double() - exact).norm() / exact.norm() < 0.02
        gate, up = gemm.pack(w[:40]), gemm.pack(w[40:])
        torch.testing.assert_close(gemm.gated(x, (gate, up), "silu").double(),
                                   F.silu(_exact(x, gate, None)) * _exact(x, up, None),
                                   atol=1e-4, rtol=1e-4)
    assert gemm.linear(torch.empty(0, 96), pw, b, None).shape == (0, 80)


def _cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


TEXTS = ["A man is playing a guitar on the stage.", "The cat sleeps.", "short",
         "Quantum computers use qubits that can be in superpositions of states, unlike "
         "classical bits, which makes some algorithms exponentially faster.",
         "What is the capital of France?", "Paris is the capital and largest city of France."]


@needs_int8
def test_minilm_int8_within_cosine_099_of_float32(minilm_dir, shared_llm, vllm_log):
    from vllm import LLM
    texts = TEXTS * 3 + [t.upper() for t in TEXTS]
    f32 = [o.outputs.embedding for o in shared_llm(minilm_dir).embed(texts)]
    q = [o.outputs.embedding for o in LLM(minilm_dir, quantization="int8").embed(texts)]
    assert "24 backbone projections in int8" in vllm_log.text
    cos = _cosines(f32, q)
    assert cos.min() >= 0.99, cos.min()
    assert cos.min() < 0.99999  # it did run in int8


@needs_int8
def test_causal_gated_model_int8(qwen3_cls_dir, shared_llm):
    """A Qwen3 classifier (SwiGLU: the gated path, RMSNorm, LAST pooling, caching on)."""
    from vllm import LLM
    texts = TEXTS[:4]
    f32 = [o.outputs.probs for o in shared_llm(qwen3_cls_dir).classify(texts)]
    llm = LLM(qwen3_cls_dir, quantization="int8")
    q = [o.outputs.probs for o in llm.classify(texts)]
    np.testing.assert_allclose(np.array(q), np.array(f32), atol=0.02)
    again = llm.classify(texts)  # prefix cache hits give the int8 answers again
    np.testing.assert_allclose(np.array([o.outputs.probs for o in again]), np.array(q),
                               atol=1e-6)


def test_int8_refused_without_int8_dot_products_or_avx2(minilm_dir, monkeypatch):
    from vllm import LLM
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: {"sse4_2"})
    with pytest.raises(ValueError, match="AVX512-VNNI, AVX-VNNI, AMX-INT8.*or AVX2.*this CPU "
                       "has none of the former.*this CPU has no AVX2"):
        LLM(minilm_dir, quantization="int8")


def _saturating_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """An int8 GEMM that adds pairs of products in int16 with saturation, as oneDNN does
    when it runs without int8 dot products (its u8 x s8 form: a shifted by 128)."""
    u = a.long() + 128
    pairs = (u[:, 0::2, None] * b.long()[0::2] + u[:, 1::2, None] * b.long()[1::2])
    acc = pairs.clamp(-32768, 32767).sum(1) - 128 * b.long().sum(0)
    return acc.to(torch.int32)


def test_int8_gemm_not_exact_falls_to_avx2(minilm_dir, monkeypatch):
    """A VNNI CPU whose oneDNN dispatches without VNNI (ONEDNN_MAX_CPU_ISA=AVX2) gave
    saturated sums, so wrong int8 numbers: the self-check catches it, and the AVX2 kernel
    (exact) runs instead; oneDNN forced (VLLM_CPU_INT8_PATH=onednn) is refused."""
    from vllm import LLM
    from vllm.platforms import current_platform
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: {"avx2", "fma", "avx512_vnni"})
    monkeypatch.setattr(torch, "_int_mm", _saturating_int_mm)
    monkeypatch.setattr(i8, "VNNI_FUSED_BY_DEFAULT", False)  # oneDNN's fallback, not its own
    i8._int_mm_exact.cache_clear()
    try:
        assert not i8.int8_gemm_exact()
        path, why = current_platform.int8_path()
        assert path == "AVX2" and "saturates" in why
        monkeypatch.setenv("VLLM_CPU_INT8_PATH", "onednn")
        with pytest.raises(ValueError, match="int8 GEMM is not exact.*ONEDNN_MAX_CPU_ISA"):
            LLM(minilm_dir, quantization="int8")
    finally:
        monkeypatch.undo()
        i8._int_mm_exact.cache_clear()
    assert i8.int8_gemm_exact() == EXACT_INT_MM


def test_bad_quantization_settings_are_clear_errors(minilm_dir):
    from vllm import LLM
    with pytest.raises(ValueError, match="quantization='awq' is not supported; use 'int8'"):
        LLM(minilm_dir, quantization="awq")
    if HAS_INT8_DOT and EXACT_INT_MM:
        with pytest.raises(ValueError, match="float32 activations; pass dtype='float32'"):
            LLM(minilm_dir, quantization="int8", dtype="bfloat16")


def test_cli_quantization_flag(minilm_dir):
    from vllm.entrypoints.openai.cli_args import engine_args_from_namespace, parse_serve_args
    args = parse_serve_args(["--model", minilm_dir, "--quantization", "int8"])
    assert engine_args_from_namespace(args).quantization == "int8"
    assert parse_serve_args(["--model", minilm_dir, "-q", "int8"]).quantization == "int8"
    assert parse_serve_args(["--model", minilm_dir]).quantization is None
    with pytest.raises(SystemExit):
        parse_serve_args(["--model", minilm_dir, "-q", "awq"])
