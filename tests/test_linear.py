"""The projections' GEMMs: oneDNN with fused epilogues must equal plain torch, and a
layer bound to one keeps computing the same."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vllm.model_executor.layers import linear as lin

REFERENCE = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
             "relu": F.relu, "silu": F.silu, None: lambda x: x}
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _cpp_gemm():
    from vllm._kernels.cpu_kernels import f32_gemm_kernel
    from vllm.model_executor.layers.f32_gemm import CppGemm
    kernel = f32_gemm_kernel()
    return None if kernel is None else CppGemm(kernel)


@pytest.fixture(params=["onednn", "torch", "cpp"])
def gemm(request):
    """Each GEMM implementation (oneDNN skipped where torch has none, the C++ float32 GEMM
    where the kernel library has no SIMD build; it runs other dtypes on torch ops)."""
    if request.param == "cpp":
        return _cpp_gemm() or pytest.skip("the C++ float32 GEMM is not built here")
    return lin.GEMMS[request.param]


def _usable(gemm, dtype) -> None:
    if gemm is lin.ONEDNN and not lin.onednn_linear_ok(dtype):
        pytest.skip(f"oneDNN does not pass its self-check for {dtype} on this CPU")


def _weight(gemm, w: torch.Tensor, gated: bool = False):
    """w as `gemm` takes it: packed for the C++ GEMM where it packs that dtype (a gated
    weight as its two halves), else plain (oneDNN takes a plain weight too)."""
    if gemm.name != "cpp" or gemm.pack(w) is None:
        return w
    return tuple(map(gemm.pack, w.chunk(2, dim=0))) if gated else gemm.pack(w)


def _inputs(dtype, m=37, k=96, n=80):
    g = torch.Generator().manual_seed(1)
    wide = torch.randn(m, 2 * k, generator=g)
    x = wide[:, :k]                         # a non-contiguous view, as q/k/v splits are
    return (x.to(dtype), torch.randn(2 * n, k, generator=g).to(dtype),
            torch.randn(n, generator=g).to(dtype), torch.randn(m, n, generator=g).to(dtype))


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    scale = want.abs().max().item()
    err = (got.double() - want).abs().max().item()
    assert err <= TOL[dtype] * scale, f"max error {err:.3g} vs scale {scale:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", list(REFERENCE))
def test_linear_with_activation(gemm, dtype, activation):
    _usable(gemm, dtype)
    x, w, b, _ = _inputs(dtype)
    w = w[: w.shape[0] // 2]
    want = REFERENCE[activation](F.linear(x.double(), w.double(), b.double()))
    _close(gemm.linear(x, _weight(gemm, w), b, activation), want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_add_and_mul(gemm, dtype):
    _usable(gemm, dtype)
    x, w, b, other = _inputs(dtype)
    w = w[: w.shape[0] // 2]
    ref = F.linear(x.double(), w.double(), b.double())
    w = _weight(gemm, w)
    _close(gemm.linear_add(x, other, w, b), ref + other.double(), dtype)
    _close(gemm.linear_mul(x, other, w, b), ref * other.double(), dtype)
    _close(gemm.linear_add(x, other, w, None), ref - b.double() + other.double(), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_silu_is_silu_gate_times_up(gemm, dtype):
    _usable(gemm, dtype)
    x, w, _, _ = _inputs(dtype)
    gate, up = F.linear(x.double(), w.double()).chunk(2, dim=-1)
    _close(gemm.gated(x, _weight(gemm, w, gated=True)), F.silu(gate) * up, dtype)


def test_platform_choice(monkeypatch):
    """The CPU platform picks oneDNN where it passes its self-check, unless turned off;
    float16 always gets F.linear. (The C++ float32 GEMM's turn: test_f32_gemm.py.)"""
    from vllm.platforms import platform_for
    cpu = platform_for("cpu")
    monkeypatch.setenv("VLLM_CPU_F32_GEMM", "onednn")
    want = "onednn" if lin.onednn_linear_ok(torch.float32) else "torch"
    assert cpu.linear_impl(torch.float32) == want
    assert cpu.linear_impl(torch.float16) == "torch"
    monkeypatch.setenv("VLLM_CPU_ONEDNN_LINEAR", "0")
    assert cpu.linear_impl(torch.float32) == "torch"


def test_module_keeps_nn_linear_parameters():
    layer = lin.Linear(8, 4, activation="gelu")
    assert isinstance(layer, torch.nn.Linear)
    assert set(dict(layer.named_parameters())) == {"weight", "bias"}
    with pytest.raises(ValueError, match="hidden_act 'swiglu' is not supported"):
        lin.Linear(8, 4, activation="swiglu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bound_layers_compute_the_same(gemm, dtype):
    """Binding to oneDNN packs every weight, keeps every projection's output (to GEMM
    rounding) and releases the plain weight; binding to torch packs nothing and changes
    nothing."""
    _usable(gemm, dtype)
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"plain": lin.Linear(96, 80),
                                 "act": lin.Linear(96, 80, activation="gelu"),
                                 "gated": lin.GatedLinear(96, 40)}).to(dtype)
    x, _, _, other = _inputs(dtype)
    with torch.inference_mode():
        before = [model["plain"](x), model["plain"].forward_add(x, other), model["act"](x),
                  model["gated"](x)]
        packed = lin.bind_linear(model, gemm)
        after = [model["plain"](x), model["plain"].forward_add(x, other), model["act"](x),
                 model["gated"](x)]
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, atol=TOL[dtype], rtol=TOL[dtype])
    if gemm is lin.TORCH or (gemm.name == "cpp" and dtype != torch.float32):
        # nothing packed (the C++ GEMM packs float32 only: other dtypes run torch's ops)
        assert packed == 0 and not any(p.is_meta for p in model.parameters())
        assert all(torch.equal(a, b) for a, b in zip(before, after))
        return
    assert packed == 3 and lin.bind_linear(model, gemm) == 3   # binding twice is a no-op
    assert all(model[k].weight.is_meta and model[k].weight.shape == (80, 96) for k in model)
    from vllm.model_executor.weight_utils import copy_param
    with pytest.raises(RuntimeError, match="already packed"):
        copy_param(model["plain"].weight, torch.zeros(80, 96, dtype=dtype), "plain.weight")


def test_bfloat16_engine_tracks_float32(shared_llm, minilm_dir):
    """The whole bf16 path (oneDNN projections, bf16 attention) stays within cos 0.999."""
    texts = ["a short sentence", "the quick brown fox jumps over the lazy dog " * 12,
             "vLLM pools hidden states into one embedding per prompt"]
    fp32 = np.array([o.outputs.embedding for o in shared_llm(minilm_dir).embed(texts)])
    bf16 = np.array([o.outputs.embedding
                     for o in shared_llm(minilm_dir, dtype="bfloat16").embed(texts)])
    cos = (fp32 * bf16).sum(1) / np.linalg.norm(fp32, axis=1) / np.linalg.norm(bf16, axis=1)
    assert cos.min() >= 0.999, cos
