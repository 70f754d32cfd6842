"""quantization="int8" on the fused AMX-INT8 kernel (csrc/int8_gemm_amx.cpp, path
"AMX_FUSED"): its floats bit-identical to the oneDNN path's on random shapes (M, K and N
off every tile size), every epilogue mode and the int8 range's edges; its quantized
output the bytes `quantize_rows` makes; every layer entry point and MiniLM's embeddings
through the engine equal across paths; right after oneDNN's own AMX kernels ran on the
same threads; the weight's slack enforced; the path chosen as `choose_path` says. The
kernel's tests skip on CPUs without AMX-INT8; the path choice is tested everywhere.
"""
from __future__ import annotations

from typing import Callable

import pytest
import torch

from test_int8_vnni import _exact_reference_gemm, _exact_sums, _mismatches, _operands, \
    assert_engine_equal_across_paths, fused_kernel_or_skip
from vllm._kernels import cpu_kernels
from vllm.model_executor.layers import int8_linear as i8

AMX = cpu_kernels.AMX_FLAGS <= cpu_kernels.cpu_flags()
needs_amx = pytest.mark.skipif(not AMX, reason="the AMX int8 kernel needs a CPU with "
                               "AMX-INT8 (amx_tile, amx_int8, avx512bw, avx512f)")


@pytest.fixture(scope="module")
def amx_gemm() -> Callable:
    return fused_kernel_or_skip("int8_gemm_amx", "AMX", "AMX-INT8")


def _run(kernel, a, w, rs, cs, bias, mode, other, **kw):
    return kernel(a, i8.pack_avx2(w, kernel.block, kernel.slack), w.shape[0], rs, cs, bias,
                  mode, other, **kw)


@needs_amx
def test_kernel_bit_identical_on_random_shapes_and_modes(amx_gemm):
    """M 1..130 (32-row tiles, past a 64-row panel), K not a multiple of 4 nor of 64 (the
    last tile reads into the next block), N odd numbers of 16-column blocks; activations
    strided as models pass them; every epilogue mode, with and without bias."""
    g = torch.Generator().manual_seed(0)
    shapes = [(1, 37, 21), (2, 3, 5), (5, 100, 75), (16, 64, 16), (17, 255, 129),
              (33, 385, 1000), (64, 1, 17), (65, 520, 65), (130, 1537, 40), (31, 130, 200)]
    assert _mismatches(lambda a, w, *rest: _run(amx_gemm, a, w, *rest), shapes, g) == []


@needs_amx
def test_kernel_sums_exact_at_the_int8_edges(amx_gemm):
    """Unit scales give the int32 sums back as floats: all +-127 and -128 (signed x signed
    tiles: no shift), alternating signs, and a K of 1001 (sums up to 127 * 127 * 1001)."""
    cases = []
    for av in (127, -127, -128):
        for wv in (127, -127):
            cases.append((torch.full((9, 1001), av, dtype=torch.int8),
                          torch.full((33, 1001), wv, dtype=torch.int8)))
    alternating = torch.tensor([127, -127] * 50, dtype=torch.int8)
    cases.append((alternating.repeat(7, 1), -alternating.repeat(20, 1)))
    for a, w in cases:
        acc = _exact_sums(a, w)
        m, n = acc.shape
        got = _run(amx_gemm, a, w, torch.ones(m), torch.ones(n), None, 0, None)
        assert torch.equal(got, acc.float()), (a[0, :2], w[0, :2])


@needs_amx
def test_kernel_quantized_output_is_quantize_rows_of_its_floats(amx_gemm):
    """`quantized=True`: the output's rows as `quantize_rows` makes them, in the GEMM's
    pass (whole-row tasks) or after it (few rows: the columns split between tasks); with
    `floats=False` the same bytes and no floats."""
    quantize, _ = cpu_kernels.int8_kernels()
    g = torch.Generator().manual_seed(2)
    for m, k, n, mode in [(400, 100, 75, 3), (5, 64, 1000, 0), (1, 37, 21, 1),
                          (97, 600, 130, 4)]:
        a, w, rs, cs = _operands(m, k, n, g)
        rs[0] = 0.0
        other = torch.randn(m, n, generator=g) if mode in (1, 2) else None
        bias = torch.randn(n, generator=g) if mode else None
        out, q, s = _run(amx_gemm, a, w, rs, cs, bias, mode, other, quantized=True)
        want_q, want_s = quantize(out)
        assert torch.equal(q, want_q) and torch.equal(s, want_s), (m, k, n, mode)
        none, q2, s2 = _run(amx_gemm, a, w, rs, cs, bias, mode, other, quantized=True,
                            floats=False)
        assert torch.equal(q2, q) and torch.equal(s2, s)
        assert none.shape == (m, n) and none.untyped_storage().nbytes() == 4 * n


@needs_amx
def test_kernel_layer_norm_in_its_pass(amx_gemm):
    """`norm=`: the separate C++ LayerNorm pass's floats bit for bit, whole-row and split
    tasks."""
    layer_norm = cpu_kernels.int8_layer_norm_kernel()
    g = torch.Generator().manual_seed(6)
    for m, k, n in [(400, 100, 384), (5, 64, 1000)]:
        a, w, rs, cs = _operands(m, k, n, g)
        bias, residual = torch.randn(n, generator=g), torch.randn(m, n, generator=g)
        nw, nb = torch.randn(n, generator=g), torch.randn(n, generator=g)
        plain = _run(amx_gemm, a, w, rs, cs, bias, 1, residual)
        got = _run(amx_gemm, a, w, rs, cs, bias, 1, residual, norm=(nw, nb, 1e-5))
        assert torch.equal(got, layer_norm(plain, nw, nb, 1e-5)), (m, k, n)


@needs_amx
def test_kernel_bfloat16_output(amx_gemm):
    """`out_dtype=torch.bfloat16`: the floats' `.bfloat16()` bit for bit."""
    g = torch.Generator().manual_seed(8)
    for m, k, n in [(400, 100, 1152), (5, 64, 1000)]:
        a, w, rs, cs = _operands(m, k, n, g)
        bias = torch.randn(n, generator=g)
        got = _run(amx_gemm, a, w, rs, cs, bias, 0, None, out_dtype=torch.bfloat16)
        assert torch.equal(got, _run(amx_gemm, a, w, rs, cs, bias, 0, None).bfloat16())


@needs_amx
def test_kernel_after_onednn_amx_on_the_same_threads(amx_gemm):
    """oneDNN's AMX kernels (a bf16 GEMM) leave their own tile shapes configured on the
    OpenMP threads; each task configures its own, so the sums stay exact."""
    g = torch.Generator().manual_seed(4)
    a = torch.randint(-127, 128, (300, 200), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (90, 200), generator=g, dtype=torch.int8)
    want = _exact_sums(a, w).float()
    for _ in range(3):
        x = torch.randn(333, 77, generator=g).bfloat16()
        torch.nn.functional.linear(x, torch.randn(45, 77, generator=g).bfloat16())
        assert torch.equal(_run(amx_gemm, a, w, torch.ones(300), torch.ones(90), None, 0,
                                None), want)


@needs_amx
def test_kernel_refuses_a_weight_without_slack(amx_gemm):
    w = torch.zeros(16, 40, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="slack"):
        amx_gemm(torch.zeros(2, 40, dtype=torch.int8), i8.pack_avx2(w), 16, torch.ones(2),
                 torch.ones(16), None, 0)


@needs_amx
def test_layers_equal_the_onednn_path(amx_gemm):
    """Every entry point of AmxInt8Gemm gives the oneDNN path's floats bit for bit, and
    `mlp_add` hands the hidden rows over as on the VNNI kernel."""
    from vllm.model_executor.layers.linear import Linear, mlp_add
    kernels = cpu_kernels.int8_kernels()
    fused, onednn = i8.AmxInt8Gemm(kernels, amx_gemm), _exact_reference_gemm(kernels)
    assert fused.path == "AMX_FUSED"
    g = torch.Generator().manual_seed(1)
    for rows in (1, 9, 70):
        x = torch.randn(2, rows, 100, generator=g)
        w, b = torch.randn(75, 100, generator=g) / 10, torch.randn(75, generator=g)
        other = torch.randn(2, rows, 75, generator=g)
        pf, po = fused.pack(w), onednn.pack(w)
        for act in (None, "gelu", "gelu_tanh", "silu", "relu"):
            assert torch.equal(fused.linear(x, pf, b, act), onednn.linear(x, po, b, act))
        assert torch.equal(fused.linear_add(x, other, pf, b), onednn.linear_add(x, other, po, b))
        assert torch.equal(fused.linear_mul(x, other, pf, b), onednn.linear_mul(x, other, po, b))
        assert torch.equal(fused.gated(x, (fused.pack(w[:36]), fused.pack(w[36:72]))),
                           onednn.gated(x, (onednn.pack(w[:36]), onednn.pack(w[36:72]))))
    torch.manual_seed(3)
    up, down = Linear(64, 200, activation="gelu"), Linear(200, 64)
    for layer in (up, down):
        layer.bind(fused)
    x, residual = torch.randn(70, 64), torch.randn(70, 64)
    assert up.forward_hidden(x)[1] is not None
    assert torch.equal(mlp_add(up, down, x, residual), down.forward_add(up(x), residual))


@pytest.mark.parametrize("flags,forced,default,amx_ok,want", [
    ({"avx512_vnni", "amx_int8"}, "auto", True, True, "AMX_FUSED"),     # the default
    ({"avx512_vnni", "amx_int8"}, "auto", False, True, "AMX"),          # oneDNN's
    ({"avx512_vnni", "amx_int8"}, "auto", True, False, "AMX"),          # kernel missing
    ({"avx512_vnni", "amx_int8"}, "amx_fused", False, True, "AMX_FUSED"),  # forced
    ({"avx512_vnni", "amx_int8"}, "vnni_fused", True, True, "VNNI_FUSED"),
    ({"avx512_vnni", "amx_int8"}, "onednn", True, True, "AMX"),
    ({"avx512_vnni"}, "auto", True, True, "VNNI_FUSED"),                # no AMX: VNNI's
])
def test_path_chosen(monkeypatch, flags, forced, default, amx_ok, want):
    monkeypatch.setattr(i8, "AMX_FUSED_BY_DEFAULT", default)
    path, why = i8.choose_path(flags, forced, lambda: True, lambda: None, lambda: None,
                               lambda: None if amx_ok else "missing")
    assert path == want and why


def test_forced_path_refused_where_the_kernel_cannot_run():
    with pytest.raises(ValueError, match="VLLM_CPU_INT8_PATH=amx_fused: the AMX kernel is "
                       "unavailable"):
        i8.choose_path({"avx2"}, "amx_fused", lambda: True, lambda: None, lambda: None,
                       lambda: "unavailable (this CPU has no AMX-INT8)")


@needs_amx
def test_minilm_embeddings_equal_across_paths(minilm_dir, amx_gemm, vllm_log, monkeypatch):
    """The engine by default (AMX_FUSED on this CPU) and on oneDNN's path: the same
    embeddings, bit for bit, and the path logged."""
    assert_engine_equal_across_paths(minilm_dir, monkeypatch, "auto", "AMX_FUSED")
    assert "int8 projections: AMX_FUSED path (C++ AMX tdpbssd kernel" in vllm_log.text


def test_kernel_withheld_where_linux_refuses_the_tiles(monkeypatch):
    """A library whose AMX kernel cannot get the tile state from Linux: the kernel is None
    with a status saying why, so "auto" falls back to oneDNN's path instead of failing
    every forward."""
    lib = cpu_kernels.library()
    if lib is None or not hasattr(lib, "vllm_int8_gemm_amx_permitted"):
        pytest.skip("no kernel library with the AMX kernel: "
                    f"{cpu_kernels.kernel_status('library')}")

    class Refusing:
        def __getattr__(self, name):
            return getattr(lib, name)

        def vllm_int8_gemm_amx_built(self):
            return 1

        def vllm_int8_gemm_amx_permitted(self):
            return 0

    monkeypatch.setattr(cpu_kernels, "library", lambda: Refusing())
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: set(cpu_kernels.AMX_FLAGS))
    assert cpu_kernels.int8_gemm_amx_kernel() is None
    assert "Linux refused" in cpu_kernels.kernel_status("int8_gemm_amx")
