"""The few-row projection kernel (csrc/skinny_gemm.cpp) reads oneDNN's packed weights and
equals F.linear with every epilogue; bound layers use it up to MAX_ROWS rows, oneDNN above,
and the engine gives the same embeddings with it on and off."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vllm._kernels import cpu_kernels
from vllm.model_executor.layers import linear as lin
from vllm.model_executor.layers import skinny_gemm as sg

pytestmark = pytest.mark.skipif(
    not ({"avx512f"} <= cpu_kernels.cpu_flags() or {"avx2", "fma"} <= cpu_kernels.cpu_flags())
    or not lin.onednn_linear_ok(torch.float32),
    reason="the few-row kernel needs an AVX2 or AVX-512 CPU and oneDNN float32 projections")

REFERENCE = {None: lambda y, o: y, "add": lambda y, o: y + o, "mul": lambda y, o: y * o,
             "gelu": lambda y, o: F.gelu(y), "silu": lambda y, o: F.silu(y),
             "relu": lambda y, o: F.relu(y)}


@pytest.fixture(scope="module")
def kernel():
    """The kernel of whatever build this is (AVX2 or AVX-512), used by the engine or not:
    every build that has it is checked; a missing build is a failure, not a skip."""
    fn = cpu_kernels.skinny_gemm_kernel(engine=False)
    assert fn is not None, cpu_kernels.kernel_status("skinny_gemm")
    return fn


@pytest.mark.parametrize("n,k", [(1152, 384), (384, 1536), (100, 72), (8, 40), (1000, 70)])
def test_layout_probe_finds_the_kernels_layout(kernel, n, k):
    """Every shape a model has, whole blocks or not: oneDNN's packing is one the kernel
    reads (if this fails on a new torch, the engine falls back to oneDNN: see below)."""
    layout = sg.packed_layout(n, k)
    assert layout is not None
    kp, nb = layout
    assert kp >= k and nb % kernel.tile_width == 0


@pytest.mark.parametrize("mode", list(REFERENCE))
@pytest.mark.parametrize("n,k", [(1152, 384), (100, 72), (8, 40)])
def test_kernel_equals_f_linear(kernel, mode, n, k):
    g = torch.Generator().manual_seed(n + k)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    weight = sg.skinny_weight(kernel, lin.pack_weight(w), w)
    assert weight is not None
    for rows in range(1, sg.MAX_ROWS + 1, 3):
        # x and other as strided views (rows of a wider tensor), as models hand them over
        x = torch.randn(rows, k + 5, generator=g)[:, 2:k + 2]
        other = torch.randn(rows, n + 3, generator=g)[:, :n]
        for bias in (b, None):
            ref = F.linear(x.double(), w.double(), None if bias is None else bias.double())
            got = weight(x, bias, mode, other if mode in ("add", "mul") else None)
            want = REFERENCE[mode](ref, other.double())
            assert got.shape == (rows, n)
            assert (got.double() - want).abs().max().item() < 1e-4 * max(1.0, k ** 0.5)


def test_kernel_refuses_bad_operands(kernel):
    w = torch.randn(64, 32)
    weight = sg.skinny_weight(kernel, lin.pack_weight(w), w)
    with pytest.raises(RuntimeError, match=r"x must be float32 \[M, 32\]"):
        weight(torch.randn(2, 31))
    with pytest.raises(RuntimeError, match=r"other must be float32 \[2, 64\]"):
        weight(torch.randn(2, 32), None, "add", torch.randn(3, 64))
    assert sg.skinny_weight(kernel, w, w) is None   # a plain weight: not packed


def _model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"plain": lin.Linear(96, 80),
                                "gelu": lin.Linear(96, 80, activation="gelu"),
                                "tanh": lin.Linear(96, 80, activation="gelu_tanh"),
                                "gated": lin.GatedLinear(96, 40)})


def _outputs(model, x, other):
    return [model["plain"](x), model["plain"].forward_add(x, other),
            model["plain"].forward_mul(x, other), model["gelu"](x), model["tanh"](x),
            model["gated"](x)]


@pytest.mark.parametrize("rows", [1, sg.MAX_ROWS, sg.MAX_ROWS + 1])
def test_bound_layers_use_it_up_to_max_rows(kernel, rows):
    """Bound with the kernel, layers give oneDNN's results (to rounding) at every row
    count, and call the kernel exactly up to MAX_ROWS rows."""
    model, reference = _model(), _model()
    g = torch.Generator().manual_seed(rows)
    x, other = torch.randn(rows, 96, generator=g), torch.randn(rows, 80, generator=g)
    calls = []

    def counting(*args):
        calls.append(args[0].shape[0])
        return kernel(*args)
    counting.tile_width = kernel.tile_width
    factory = lambda packed, w: sg.skinny_weight(counting, packed, w)  # noqa: E731
    with torch.inference_mode():
        lin.bind_linear(model, lin.ONEDNN, factory)
        lin.bind_linear(reference, lin.ONEDNN)
        assert all(model[name].skinny is not None for name in model)
        got, want = _outputs(model, x, other), _outputs(reference, x, other)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (len(calls) > 0) == (rows <= sg.MAX_ROWS)


def test_engine_same_with_and_without_it(minilm_dir, monkeypatch, vllm_log):
    """MiniLM on short prompts (every step a few rows): the kernel on (logged) and off."""
    from vllm import LLM
    prompts = ["short", "what is the capital of France?", "a b c d e f g"]
    with_kernel = [o.outputs.embedding for o in LLM(minilm_dir).embed(prompts)]
    assert "also run few rows on the C++ kernel" in vllm_log.text
    monkeypatch.setenv("VLLM_CPU_SKINNY_GEMM", "0")
    without = [o.outputs.embedding for o in LLM(minilm_dir).embed(prompts)]
    np.testing.assert_allclose(np.array(with_kernel), np.array(without), atol=2e-6)


def test_a_kernel_that_disagrees_is_not_used(monkeypatch, vllm_log):
    """Where the kernel does not read this oneDNN's layout or differs from F.linear, the
    platform keeps oneDNN for every row count and says so once."""
    from vllm.platforms import cpu
    monkeypatch.setattr(sg, "kernel_matches_torch", lambda kernel: False)
    cpu._skinny_kernel.cache_clear()
    try:
        assert cpu.CpuPlatform("cpu").skinny_gemm(torch.float32) is None
        assert "does not read this oneDNN's packed weights" in vllm_log.text
    finally:
        cpu._skinny_kernel.cache_clear()
    assert cpu.CpuPlatform("cpu").skinny_gemm(torch.bfloat16) is None


def test_layout_match_rejects_a_different_layout():
    """The probe's matcher accepts exactly the blocked layout it describes: a [n/nb][kp][nb]
    buffer (padding included) matches with its (kp, nb); the same values transposed within
    each block ([kp][nb] -> [nb][kp]) match nothing."""
    n, k, nb, kp = 70, 24, 32, 32
    blocks = -(-n // nb)
    i = torch.arange(blocks * kp * nb)
    rows = ((i // (kp * nb)) * nb + i % nb).float()
    cols = ((i % (kp * nb)) // nb).float()
    outside = (rows >= n) | (cols >= k)
    rows[outside], cols[outside] = 0, 0
    assert sg._match(rows, cols, i, i.numel(), n, k) == (kp, nb)
    swap = lambda t: t.view(blocks, kp, nb).transpose(1, 2).reshape(-1)  # noqa: E731
    assert sg._match(swap(rows), swap(cols), i, i.numel(), n, k) is None


def test_a_large_weight_is_probed_at_sampled_places(kernel):
    """Above 2^16 elements the probe reads sampled places only, and still finds the layout."""
    assert sg._positions(1 << 16).numel() == 1 << 16
    assert sg._positions(1 << 24).numel() == 3 << 15
    assert sg.packed_layout(4096, 1024) is not None
