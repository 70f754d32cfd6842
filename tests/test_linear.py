"""The projections' GEMM backend: oneDNN with fused epilogues must equal plain torch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vllm.model_executor.layers import linear as lin

REFERENCE = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
             "relu": F.relu, "silu": F.silu, None: lambda x: x}
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


@pytest.fixture(params=["onednn", "torch"])
def backend(request, monkeypatch):
    """Run a test once with oneDNN allowed (where torch has it) and once with it off."""
    monkeypatch.setenv("VLLM_CPU_ONEDNN_LINEAR", "1" if request.param == "onednn" else "0")
    lin.onednn_linear_ok.cache_clear()
    yield request.param
    lin.onednn_linear_ok.cache_clear()


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
def test_linear_with_activation(backend, dtype, activation):
    x, w, b, _ = _inputs(dtype)
    w = w[: w.shape[0] // 2]
    want = REFERENCE[activation](F.linear(x.double(), w.double(), b.double()))
    _close(lin.linear(x, w, b, activation), want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_add_and_mul(backend, dtype):
    x, w, b, other = _inputs(dtype)
    w = w[: w.shape[0] // 2]
    ref = F.linear(x.double(), w.double(), b.double())
    _close(lin.linear_add(x, other, w, b), ref + other.double(), dtype)
    _close(lin.linear_mul(x, other, w, b), ref * other.double(), dtype)
    _close(lin.linear_add(x, other, w, None), ref - b.double() + other.double(), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_silu_is_silu_gate_times_up(backend, dtype):
    x, w, _, _ = _inputs(dtype)
    gate, up = F.linear(x.double(), w.double()).chunk(2, dim=-1)
    _close(lin.gated_silu(x, w), F.silu(gate) * up, dtype)


def test_backend_choice(backend):
    want = "onednn" if backend == "onednn" and torch.backends.mkldnn.is_available() \
        else "torch"
    assert lin.linear_backend(torch.device("cpu"), torch.float32) == want
    assert lin.linear_backend(torch.device("cpu"), torch.float16) == "torch"
    assert lin.linear_backend(torch.device("meta"), torch.float32) == "torch"


def test_module_keeps_nn_linear_parameters():
    layer = lin.Linear(8, 4, activation="gelu")
    assert isinstance(layer, torch.nn.Linear)
    assert set(dict(layer.named_parameters())) == {"weight", "bias"}
    with pytest.raises(ValueError, match="hidden_act 'swiglu' is not supported"):
        lin.Linear(8, 4, activation="swiglu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_layers_compute_the_same(backend, dtype):
    """`pack_weights` keeps every projection's output bit for bit (oneDNN) and releases the
    plain weight; off the oneDNN path nothing is packed."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"plain": lin.Linear(96, 80),
                                 "act": lin.Linear(96, 80, activation="gelu"),
                                 "gated": lin.GatedLinear(96, 40)}).to(dtype)
    x, _, _, other = _inputs(dtype)
    with torch.inference_mode():
        before = [model["plain"](x), model["plain"].forward_add(x, other), model["act"](x),
                  model["gated"](x)]
        packed = lin.pack_weights(model)
        after = [model["plain"](x), model["plain"].forward_add(x, other), model["act"](x),
                 model["gated"](x)]
    if lin.linear_backend(torch.device("cpu"), dtype) == "torch":  # off (or no bf16 oneDNN)
        assert packed == 0 and not any(p.is_meta for p in model.parameters())
        return
    assert packed == 3 and lin.pack_weights(model) == 3   # packing twice is a no-op
    assert all(model[k].weight.is_meta and model[k].weight.shape == (80, 96) for k in model)
    for a, b in zip(before, after):
        assert torch.equal(a, b)
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
