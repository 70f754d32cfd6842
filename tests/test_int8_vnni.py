"""quantization="int8" on the fused AVX512-VNNI kernel (csrc/int8_gemm_vnni.cpp, path
"VNNI_FUSED"): its floats bit-identical to the oneDNN path's (torch._int_mm, then
`dequantize_rows`) on random shapes, every epilogue mode and the int8 range's edges; its
int32 sums exact (the u8 shift a + 128 and the per-column compensation cancel); every
layer entry point and MiniLM's embeddings through the engine equal across the two paths;
the path chosen and refused as `int8_linear.choose_path` says. The kernel's tests skip on
CPUs without AVX512-VNNI; the path choice is tested everywhere.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from test_int8_avx2 import TEXTS
from vllm._kernels import cpu_kernels
from vllm.model_executor.layers import int8_linear as i8

VNNI = cpu_kernels.VNNI_FLAGS <= cpu_kernels.cpu_flags()
needs_vnni = pytest.mark.skipif(not VNNI, reason="the VNNI int8 kernel needs a CPU with "
                                "AVX512-VNNI (avx512_vnni, avx512bw, avx512f)")
MODES = range(7)  # none, add, mul, gelu, silu, relu, gelu_q (skinny_gemm.MODES)


def _exact_reference_gemm(kernels) -> "i8.Int8Gemm":
    """The oneDNN path's Int8Gemm, or where oneDNN's int8 GEMM is not exact in this process
    (ONEDNN_MAX_CPU_ISA=AVX2 saturates it) the AVX2 kernel's, bit-identical to it."""
    if i8.int8_gemm_exact():
        return i8.Int8Gemm(kernels)
    avx2 = cpu_kernels.int8_gemm_avx2_kernel()
    assert avx2 is not None, cpu_kernels.kernel_status("int8_gemm_avx2")
    return i8.Avx2Int8Gemm(kernels, avx2)


def fused_kernel_or_skip(name: str, what: str, isa: str) -> Callable:
    """cpu_kernels.`name`_kernel() on a CPU with its flags: skipped where the library
    loaded is not an AVX-512 build (e.g. the x86-64-v3 one), a failure where it is and
    still lacks the kernel."""
    kernel = getattr(cpu_kernels, f"{name}_kernel")()
    if kernel is None:
        status = cpu_kernels.kernel_status(name)
        if cpu_kernels.kernel_isa() != "avx512":
            pytest.skip(f"the {what} int8 kernel is {status}")
        pytest.fail(f"an AVX-512 build on an {isa} CPU lacks the kernel: {status}")
    return kernel


@pytest.fixture(scope="module")
def vnni_gemm() -> Callable:
    return fused_kernel_or_skip("int8_gemm_vnni", "VNNI", "AVX512-VNNI")


def _reference(acc: torch.Tensor, rs, cs, bias, mode: int, other) -> torch.Tensor:
    """The oneDNN path's floats from exact int32 sums: `dequantize_rows` (C++)."""
    _, dequantize = cpu_kernels.int8_kernels()
    return dequantize(acc, rs, cs, bias, mode, other)


def _exact_sums(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """a @ w.T in int64, checked to fit int32, as int32; and torch._int_mm's where exact
    (not at K = 1: there torch 2.13's CPU _int_mm returns garbage; no model has K = 1)."""
    acc = a.long() @ w.long().t()
    assert acc.abs().max() < 2 ** 31
    if i8.int8_gemm_exact() and a.shape[1] > 1:
        assert torch.equal(torch._int_mm(a.contiguous(), w.t()).long(), acc)
    return acc.int()


def _run(kernel, a, w, rs, cs, bias, mode, other, **kw):
    return kernel(a, i8.pack_avx2(w), i8.column_compensation(w), w.shape[0], rs, cs, bias,
                  mode, other, **kw)


def _operands(m: int, k: int, n: int, g: torch.Generator) -> tuple:
    """Random int8 a [m, k], w [n, k] and small positive row / column scales."""
    a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    return a, w, torch.rand(m, generator=g) / 100, torch.rand(n, generator=g) / 100


def _mismatches(run: Callable, shapes, g: torch.Generator) -> list:
    """(m, k, n, mode, bias?) where run(a, w, rs, cs, bias, mode, other) differs from the
    oneDNN path's floats: a strided as models pass it, every epilogue mode, +- bias."""
    failed = []
    for m, k, n in shapes:
        a = torch.randint(-127, 128, (m, k + 5), generator=g, dtype=torch.int8)[:, 2:k + 2]
        w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        rs, cs = torch.rand(m, generator=g) / 100, torch.rand(n, generator=g) / 100
        b, other = torch.randn(n, generator=g), torch.randn(m, n, generator=g)
        acc = _exact_sums(a, w)
        for mode in MODES:
            for bias in (None, b):
                o = other if mode in (1, 2) else None
                got = run(a, w, rs, cs, bias, mode, o)
                if not torch.equal(got, _reference(acc, rs, cs, bias, mode, o)):
                    failed.append((m, k, n, mode, bias is not None))
    return failed


@needs_vnni
def test_kernel_bit_identical_on_random_shapes_and_modes(vnni_gemm):
    """M 1..70 (tiles of 1-6 rows, past a 48-row panel), K not a multiple of 4 (nor of 64),
    N not a multiple of 16 (nor of a 64-column tile), K past one 512 chunk; activations
    strided as models pass them; every epilogue mode, with and without bias."""
    g = torch.Generator().manual_seed(0)
    shapes = [(1, 37, 21), (2, 3, 5), (5, 100, 75), (6, 64, 16), (7, 255, 129),
              (13, 385, 1000), (48, 1, 17), (49, 520, 65), (70, 1537, 40), (31, 130, 200)]
    assert _mismatches(lambda a, w, *rest: _run(vnni_gemm, a, w, *rest), shapes, g) == []


@needs_vnni
def test_kernel_quantized_output_is_quantize_rows_of_its_floats(vnni_gemm):
    """`quantized=True` also returns the output's rows quantized, the bytes and scales
    `quantize_rows` makes of the floats: tasks of whole rows (400 rows: 9 panels of 48)
    quantize in the GEMM's pass, tasks that split the columns (few rows) in a pass after
    it; with an activation, a residual, a row of zeros (scale 0) and K past one chunk.
    `floats=False`: the same bytes, no floats (a zero-stride stand-in of their shape)."""
    quantize, _ = cpu_kernels.int8_kernels()
    g = torch.Generator().manual_seed(2)
    for m, k, n, mode in [(400, 100, 75, 3), (5, 64, 1000, 0), (1, 37, 21, 1),
                          (97, 600, 130, 4), (3, 40, 17, 0)]:
        a, w, rs, cs = _operands(m, k, n, g)
        rs[0] = 0.0  # a row of zeros: scale 0, q 0
        other = torch.randn(m, n, generator=g) if mode in (1, 2) else None
        bias = torch.randn(n, generator=g) if mode else None
        out, q, s = vnni_gemm(a, i8.pack_avx2(w), i8.column_compensation(w), n, rs, cs,
                              bias, mode, other, quantized=True)
        want_q, want_s = quantize(out)
        assert torch.equal(q, want_q) and torch.equal(s, want_s), (m, k, n, mode)
        if mode == 0:
            assert s[0] == 0 and not q[0].any()
        none, q2, s2 = vnni_gemm(a, i8.pack_avx2(w), i8.column_compensation(w), n, rs, cs,
                                 bias, mode, other, quantized=True, floats=False)
        assert torch.equal(q2, q) and torch.equal(s2, s), (m, k, n, mode)
        assert none.shape == (m, n) and not none.any()
        assert none.untyped_storage().nbytes() == 4 * n  # one row of zeros, expanded


@needs_vnni
def test_kernel_layer_norm_in_its_pass(vnni_gemm):
    """`norm=`: each row of the epilogue's output layer-normed in the GEMM's pass: the
    floats of the separate C++ pass (`int8_layer_norm_kernel`, which the other int8 paths
    run after their GEMM) bit for bit, whole-row tasks and split ones (few rows), with and
    without a norm bias; and torch's LayerNorm to float32 rounding."""
    layer_norm = cpu_kernels.int8_layer_norm_kernel()
    g = torch.Generator().manual_seed(6)
    for m, k, n, with_bias in [(400, 100, 384, True), (5, 64, 1000, True), (97, 600, 75, False)]:
        a, w, rs, cs = _operands(m, k, n, g)
        bias, residual = torch.randn(n, generator=g), torch.randn(m, n, generator=g)
        nw, nb = torch.randn(n, generator=g), torch.randn(n, generator=g) if with_bias else None
        plain = _run(vnni_gemm, a, w, rs, cs, bias, 1, residual)
        got = _run(vnni_gemm, a, w, rs, cs, bias, 1, residual, norm=(nw, nb, 1e-5))
        assert torch.equal(got, layer_norm(plain, nw, nb, 1e-5)), (m, k, n)
        want = F.layer_norm(plain, (n,), nw, nb, 1e-5)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_vnni
def test_kernel_bfloat16_output(vnni_gemm):
    """`out_dtype=torch.bfloat16`: the rows rounded in the pass, the floats' `.bfloat16()`
    bit for bit (whole-row tasks, split ones, a tail of columns); not with `quantized`."""
    if not cpu_kernels.BF16_FLAGS <= cpu_kernels.cpu_flags():  # else the build must have it
        pytest.skip("this CPU has no AVX512-BF16")
    g = torch.Generator().manual_seed(8)
    for m, k, n, mode in [(400, 100, 1152, 0), (5, 64, 1000, 3), (3, 37, 37, 0)]:
        a, w, rs, cs = _operands(m, k, n, g)
        args = (vnni_gemm, a, w, rs, cs, torch.randn(n, generator=g), mode, None)
        got = _run(*args, out_dtype=torch.bfloat16)
        assert got.dtype == torch.bfloat16 and torch.equal(got, _run(*args).bfloat16())
    with pytest.raises(RuntimeError, match="not also quantized"):
        _run(*args, quantized=True, out_dtype=torch.bfloat16)


def test_linear_add_norm_on_every_int8_path_and_its_fallbacks(monkeypatch):
    """`Linear.forward_add_norm`: on an int8 GEMM the C++ LayerNorm (fused or after the
    GEMM: the same floats on the oneDNN / AVX2 / VNNI paths); without its kernels, or with a
    norm that is not a LayerNorm over the output, `norm(forward_add(...))`."""
    from torch import nn
    from vllm.model_executor.layers.linear import Linear
    torch.manual_seed(4)
    norm = nn.LayerNorm(48)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    x, residual = torch.randn(30, 32), torch.randn(30, 48)
    weight, bias = torch.randn(48, 32), torch.randn(48)

    def run(gemm, module=norm):
        layer = Linear(32, 48)
        layer.weight.data.copy_(weight)
        layer.bias.data.copy_(bias)
        layer.bind(gemm)
        return layer.forward_add_norm(x, residual, module), \
            module(layer.forward_add(x, residual))
    kernels = cpu_kernels.int8_kernels()
    plain = i8.Int8Gemm(None, "VNNI")  # torch ops: F.layer_norm after the GEMM
    got, want = run(plain)
    assert torch.equal(got, want)
    if kernels is not None and i8.int8_gemm_exact():
        onednn = i8.Int8Gemm(kernels, "VNNI")
        onednn.layer_norm = cpu_kernels.int8_layer_norm_kernel()
        got, want = run(onednn)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(got, onednn.layer_norm(onednn.linear_add(
            x, residual, onednn.pack(weight), bias), norm.weight, norm.bias, norm.eps))
        if cpu_kernels.int8_gemm_vnni_kernel() is not None:
            fused = i8.VnniInt8Gemm(kernels, cpu_kernels.int8_gemm_vnni_kernel())
            assert torch.equal(run(fused)[0], got)
    rms = nn.RMSNorm(48)  # not a LayerNorm: applied after forward_add
    got, want = run(plain, rms)
    assert torch.equal(got, want)
    layer = Linear(32, 48)  # forward_bf16 without a kernel to round in: the cast
    layer.bind(plain)
    assert torch.equal(layer.forward_bf16(x), layer(x).bfloat16())


@needs_vnni
def test_mlp_hands_its_hidden_rows_over_quantized(vnni_gemm, monkeypatch):
    """`mlp_add(up, down, x, residual)` on Linear layers bound to the VNNI path: the same
    floats as `down.forward_add(up(x), residual)`, with one quantizing pass fewer (the up
    GEMM quantized its rows) and no float hidden rows made (a zero-stride stand-in of their
    shape); the gated form likewise; a down layer under no int8 GEMM refuses them."""
    from vllm.model_executor.layers.linear import GatedLinear, Linear, mlp_add
    kernels = cpu_kernels.int8_kernels()
    gemm = i8.VnniInt8Gemm(kernels, vnni_gemm)
    passes = []
    quantize = gemm.quantize
    monkeypatch.setattr(gemm, "quantize", lambda rows: passes.append(1) or quantize(rows))
    torch.manual_seed(3)
    for up in (Linear(64, 200, activation="gelu"), GatedLinear(64, 200)):
        down = Linear(200, 64)
        for layer in (up, down):
            layer.bind(gemm)
        x, residual = torch.randn(70, 64), torch.randn(70, 64)
        passes.clear()
        want = down.forward_add(up(x), residual)
        separate = len(passes)
        passes.clear()
        got = mlp_add(up, down, x, residual)
        assert torch.equal(got, want) and len(passes) == separate - 1, (type(up), passes)
        hidden, quantized = up.forward_hidden(x)
        assert quantized is not None and hidden.shape == (70, 200)
        assert hidden.stride() == (0, 1) and not hidden.any()  # no floats were written
    with pytest.raises(AssertionError, match="int8 GEMM"):
        Linear(200, 64).forward_add(hidden, residual, quantized)


@needs_vnni
def test_kernel_sums_exact_at_the_int8_edges(vnni_gemm):
    """Unit scales give the int32 sums back as floats (exact below 2^24): all +-127 (the
    largest |sums| and compensations), alternating signs, -128 (u = 0: still exact, though
    the quantizer never makes it) and a K of 1001 whose sums reach 127 * 127 * 1001."""
    cases = []
    for av in (127, -127, -128):
        for wv in (127, -127):
            cases.append((torch.full((9, 1001), av, dtype=torch.int8),
                          torch.full((33, 1001), wv, dtype=torch.int8)))
    alternating = torch.tensor([127, -127] * 50, dtype=torch.int8)
    cases.append((alternating.repeat(7, 1), alternating.repeat(20, 1)))
    cases.append((alternating.repeat(7, 1), -alternating.repeat(20, 1)))
    for a, w in cases:
        acc = _exact_sums(a, w)
        assert acc.abs().max() < 2 ** 24
        m, n = acc.shape
        got = _run(vnni_gemm, a, w, torch.ones(m), torch.ones(n), None, 0, None)
        assert torch.equal(got, acc.float()), (a[0, :2], w[0, :2])


@needs_vnni
def test_kernel_refuses_a_wrong_layout(vnni_gemm):
    q, w = torch.zeros(2, 40, dtype=torch.int8), torch.zeros(16, 40, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="packed must be"):
        vnni_gemm(q, torch.zeros(1, 9, 16, 4, dtype=torch.int8), i8.column_compensation(w),
                  16, torch.ones(2), torch.ones(16), None, 0)
    with pytest.raises(RuntimeError, match="comp must be"):
        vnni_gemm(q, i8.pack_avx2(w), torch.zeros(15, dtype=torch.int32), 16, torch.ones(2),
                  torch.ones(16), None, 0)


@needs_vnni
def test_layers_equal_the_onednn_path(vnni_gemm):
    """Every entry point of VnniInt8Gemm gives Int8Gemm's (oneDNN) floats bit for bit."""
    kernels = cpu_kernels.int8_kernels()
    fused, onednn = i8.VnniInt8Gemm(kernels, vnni_gemm), _exact_reference_gemm(kernels)
    assert fused.path == "VNNI_FUSED"
    g = torch.Generator().manual_seed(1)
    for rows in (1, 9, 70):
        x = torch.randn(2, rows, 100, generator=g)
        w, b = torch.randn(75, 100, generator=g) / 10, torch.randn(75, generator=g)
        other = torch.randn(2, rows, 75, generator=g)
        pf, po = fused.pack(w), onednn.pack(w)
        calls = {"plain": lambda gm, p: gm.linear(x, p, b, None),
                 "gelu": lambda gm, p: gm.linear(x, p, b, "gelu"),
                 "gelu_tanh": lambda gm, p: gm.linear(x, p, b, "gelu_tanh"),
                 "silu": lambda gm, p: gm.linear(x, p, b, "silu"),
                 "relu": lambda gm, p: gm.linear(x, p, None, "relu"),
                 "add": lambda gm, p: gm.linear_add(x, other, p, b),
                 "mul": lambda gm, p: gm.linear_mul(x, other, p, b)}
        for name, call in calls.items():
            assert torch.equal(call(fused, pf), call(onednn, po)), (rows, name)
        assert torch.equal(fused.gated(x, (fused.pack(w[:36]), fused.pack(w[36:72]))),
                           onednn.gated(x, (onednn.pack(w[:36]), onednn.pack(w[36:72]))))
    assert fused.linear(torch.empty(0, 100), pf, b, None).shape == (0, 75)


@pytest.mark.parametrize("flags,forced,default,vnni_ok,want", [
    ({"avx2", "avx512_vnni"}, "vnni_fused", False, True, "VNNI_FUSED"),   # forced
    ({"avx2", "avx512_vnni"}, "auto", True, True, "VNNI_FUSED"),         # the default
    ({"avx2", "avx512_vnni"}, "auto", False, True, "VNNI"),              # oneDNN's
    ({"avx2", "avx512_vnni"}, "auto", True, False, "VNNI"),              # kernel missing
    ({"avx2", "avx512_vnni", "amx_int8"}, "auto", True, True, "AMX"),    # AMX CPU: not the VNNI kernel
    ({"avx2", "avx_vnni"}, "auto", True, True, "VNNI"),                  # AVX-VNNI only
    ({"avx2", "avx512_vnni"}, "onednn", True, True, "VNNI"),
    ({"avx2", "avx512_vnni"}, "avx2", True, True, "AVX2"),
])
def test_path_chosen(monkeypatch, flags, forced, default, vnni_ok, want):
    monkeypatch.setattr(i8, "VNNI_FUSED_BY_DEFAULT", default)
    path, why = i8.choose_path(flags, forced, lambda: True, lambda: None,
                               lambda: None if vnni_ok else "missing")
    assert path == want and why


def test_forced_path_refused_where_the_kernel_cannot_run():
    with pytest.raises(ValueError, match="VLLM_CPU_INT8_PATH=vnni_fused: the VNNI kernel "
                       "is unavailable"):
        i8.choose_path({"avx2"}, "vnni_fused", lambda: True, lambda: None,
                       lambda: "unavailable (this CPU has no AVX512-VNNI)")


def assert_engine_equal_across_paths(minilm_dir: str, monkeypatch, forced: str,
                                     path: str) -> None:
    """The engine on VLLM_CPU_INT8_PATH=`forced` (path `path`) and on oneDNN's path, or
    (where oneDNN's int8 GEMM saturates: ONEDNN_MAX_CPU_ISA=AVX2) the AVX2 kernel's, which
    computes the same exact sums and floats: the same MiniLM embeddings, bit for bit."""
    from vllm import LLM
    onednn = "AMX" if "amx_int8" in cpu_kernels.cpu_flags() else "VNNI"
    reference = ("onednn", onednn) if i8.int8_gemm_exact() else ("avx2", "AVX2")
    embeddings = {}
    for env, want in ((forced, path), reference):
        monkeypatch.setenv("VLLM_CPU_INT8_PATH", env)
        llm = LLM(minilm_dir, quantization="int8")
        model = llm.llm_engine.runner.model
        assert {m.gemm.path for m in model.modules() if getattr(m, "gemm", None) is not None
                and getattr(m.gemm, "name", None) == "int8"} == {want}
        embeddings[want] = np.array([o.outputs.embedding for o in llm.embed(TEXTS)])
    np.testing.assert_array_equal(embeddings[path], embeddings[reference[1]])


@needs_vnni
def test_minilm_embeddings_equal_across_paths(minilm_dir, vnni_gemm, vllm_log, monkeypatch):
    """The engine on VLLM_CPU_INT8_PATH=vnni_fused and =onednn: the same embeddings, bit
    for bit (same quantization, same int32 sums, same float end), logged path."""
    assert_engine_equal_across_paths(minilm_dir, monkeypatch, "vnni_fused", "VNNI_FUSED")
    assert "int8 projections: VNNI_FUSED path (C++ vpdpbusd kernel" in vllm_log.text
