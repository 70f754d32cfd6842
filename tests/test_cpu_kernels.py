"""The C++ kernels (packed-sequence attention, one-pass RMSNorm) equal torch, and the
engine equals itself with them on and off."""
from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vllm._kernels import cpu_kernels
from vllm.platforms.cpu import _skinny_kernel

NONE = torch.empty(0, dtype=torch.long)
pytestmark = pytest.mark.skipif(
    not ({"avx512f"} <= cpu_kernels.cpu_flags() or {"avx2", "fma"} <= cpu_kernels.cpu_flags()),
    reason="the attention kernel needs an AVX-512 or AVX2 CPU")


@pytest.fixture(scope="module")
def kernel():
    fn = cpu_kernels.varlen_attention_kernel()
    assert fn is not None, cpu_kernels.kernel_status("varlen_attention")
    return fn


def _reference(q, k, v, lengths, causal, scale):
    out, s = [], 0
    for n in lengths:
        qs, ks, vs = (x[s: s + n].transpose(0, 1)[None].double() for x in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale,
                                           enable_gqa=True)
        out.append(o[0].transpose(0, 1))
        s += n
    return torch.cat(out)


@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_matches_sdpa(kernel, head_dim, causal):
    g = torch.Generator().manual_seed(head_dim + causal)
    # last key blocks of every length class of 16 (keys past a block's end are not scored)
    lengths = [1, 7, 17, 33, 50, 64, 65, 127, 130, 300]
    t, hq, hkv = sum(lengths), 4, 2
    # q, k, v as strided views of one fused projection output, as the models produce
    qkv = torch.randn(t, (hq + 2 * hkv) * head_dim, generator=g) * 2
    q, k, v = qkv.split([hq * head_dim, hkv * head_dim, hkv * head_dim], dim=-1)
    q, k, v = (x.view(t, -1, head_dim) for x in (q, k, v))
    offsets = torch.tensor(np.cumsum([0] + lengths))
    scale = head_dim ** -0.5
    got = kernel(q, k, v, offsets, offsets, NONE, NONE, scale, causal)
    want = _reference(q, k, v, lengths, causal, scale)
    assert got.shape == (t, hq, head_dim) and got.is_contiguous()
    assert (got.double() - want).abs().max().item() < 2e-5


@pytest.mark.parametrize("causal", [False, True])
def test_kernel_queries_after_a_cached_prefix(kernel, causal):
    """nq new queries over nk keys (prefix + new): query i sits at key nk - nq + i."""
    g = torch.Generator().manual_seed(7)
    nqs, nks = [1, 40, 70, 3], [17, 40, 200, 131]
    hq, hkv, d = 4, 2, 64
    q = torch.randn(sum(nqs), hq, d, generator=g)
    k, v = torch.randn(sum(nks), hkv, d, generator=g), torch.randn(sum(nks), hkv, d, generator=g)
    qo, ko = torch.tensor(np.cumsum([0] + nqs)), torch.tensor(np.cumsum([0] + nks))
    got = kernel(q, k, v, qo, ko, NONE, NONE, 0.125, causal)
    want = []
    for i, (nq, nk) in enumerate(zip(nqs, nks)):
        qs = q[qo[i]: qo[i + 1]].transpose(0, 1)[None].double()
        ks, vs = (x[ko[i]: ko[i + 1]].transpose(0, 1)[None].double() for x in (k, v))
        mask = torch.arange(nk)[None, :] <= (nk - nq + torch.arange(nq))[:, None]
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask if causal else None,
                                           scale=0.125, enable_gqa=True)
        want.append(o[0].transpose(0, 1))
    assert (got.double() - torch.cat(want)).abs().max().item() < 2e-5


def test_kernel_reads_keys_through_slots_with_shared_tiles(kernel):
    """Keys straight from a paged cache (key_rows), a 150-key prefix shared by 3 sequences
    (its full 64-key tiles named once in tile_ids): equal to SDPA on gathered keys."""
    g = torch.Generator().manual_seed(3)
    hq, hkv, d, slots = 4, 2, 32, 1024
    cache_k, cache_v = torch.randn(slots, hkv, d, generator=g), torch.randn(slots, hkv, d, generator=g)
    prefix = torch.randperm(slots, generator=g)[:150]
    own = torch.randperm(slots, generator=g)[:60].split([10, 20, 30])
    rows = [torch.cat([prefix, o]) for o in own]
    nqs = [len(o) for o in own]
    tiles, ids = {}, []
    for r in rows:
        for t in range(0, len(r), 64):
            ids.append(tiles.setdefault(r[t: t + 64].numpy().tobytes(), len(tiles)))
    assert len(tiles) == 2 + 3                       # two shared full tiles, one own each
    q = torch.randn(sum(nqs), hq, d, generator=g)
    qo = torch.tensor(np.cumsum([0] + nqs))
    ko = torch.tensor(np.cumsum([0] + [len(r) for r in rows]))
    got = kernel(q, cache_k, cache_v, qo, ko, torch.cat(rows), torch.tensor(ids), 0.2, True)
    k, v = cache_k[torch.cat(rows)], cache_v[torch.cat(rows)]
    want = kernel(q, k, v, qo, ko, NONE, NONE, 0.2, True)
    ref = []
    for i, nq in enumerate(nqs):
        nk = len(rows[i])
        qs = q[qo[i]: qo[i + 1]].transpose(0, 1)[None].double()
        ks, vs = (x[ko[i]: ko[i + 1]].transpose(0, 1)[None].double() for x in (k, v))
        mask = torch.arange(nk)[None, :] <= (nk - nq + torch.arange(nq))[:, None]
        ref.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=0.2,
                                                  enable_gqa=True)[0].transpose(0, 1))
    assert torch.equal(got, want)
    assert (got.double() - torch.cat(ref)).abs().max().item() < 2e-5




@pytest.fixture
def fresh_library(monkeypatch, tmp_path):
    """The loader as on a machine where the install built nothing (reloaded after)."""
    monkeypatch.setattr(cpu_kernels, "PACKAGED", tmp_path / "vllm" / "_kernels" / "none.so")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("VLLM_CPU_KERNELS_LIB", raising=False)
    cpu_kernels.library.cache_clear()
    _skinny_kernel.cache_clear()  # the platform's kernel choice, made once per process
    yield tmp_path
    monkeypatch.undo()
    cpu_kernels.library.cache_clear()
    _skinny_kernel.cache_clear()
    cpu_kernels.library()


def test_a_chosen_library_that_is_missing_is_named(fresh_library, monkeypatch):
    """VLLM_CPU_KERNELS_LIB (developers: another build) is loaded as given, never replaced
    by the installed or a JIT-built one; a missing path leaves the torch paths, said why."""
    monkeypatch.setenv("VLLM_CPU_KERNELS_JIT", "1")
    monkeypatch.setenv("VLLM_CPU_KERNELS_LIB", str(fresh_library / "avx2" / "lib.so"))
    assert cpu_kernels.library() is None
    assert cpu_kernels.kernel_status("library") == \
        f"unavailable (VLLM_CPU_KERNELS_LIB: no {fresh_library / 'avx2' / 'lib.so'})"


def test_unbuilt_kernels_one_warning_and_torch_paths(fresh_library, monkeypatch, vllm_log,
                                                     bert_embed_dir):
    """No library from the install and no JIT: the engine starts on TORCH_SDPA, and says so
    once, with how to rebuild; its embeddings equal sentence-transformers-free torch math
    (the TORCH_SDPA parity tests) because they are the torch path's."""
    from vllm import LLM
    monkeypatch.setenv("VLLM_CPU_KERNELS_JIT", "0")
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    llm = LLM(bert_embed_dir)
    llm.embed(["one prompt"])
    LLM(bert_embed_dir)
    warnings = [r.getMessage() for r in vllm_log.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "kernels unavailable (not built at install" in w]) == 1, warnings
    (w,) = [w for w in warnings if "kernels unavailable (not built at install" in w]
    assert "torch paths" in w and "pip install -e ." in w and "VLLM_CPU_KERNELS_JIT=1" in w
    assert cpu_kernels.varlen_attention_kernel() is None
    assert cpu_kernels.rms_norm_kernel() is None
    assert llm.llm_engine.runner.attention_backend == "TORCH_SDPA"


def test_jit_builds_the_library_with_cmake_into_the_cache(fresh_library, monkeypatch):
    """VLLM_CPU_KERNELS_JIT=1 (developers): the same CMakeLists.txt, built into
    $XDG_CACHE_HOME/vllm/cpu_kernels/<cpu tag>/, then loaded."""
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        pytest.skip("needs cmake and a C++ compiler")
    monkeypatch.setenv("VLLM_CPU_KERNELS_JIT", "1")
    fn = cpu_kernels.varlen_attention_kernel()
    assert fn is not None, cpu_kernels.kernel_status("varlen_attention")
    built = cpu_kernels.build_dir() / cpu_kernels.LIB_NAME
    assert built.exists() and str(fresh_library) in str(built)
    assert str(built) in cpu_kernels.kernel_status("varlen_attention")
    x = torch.randn(5, 2, 16)
    off = torch.tensor([0, 5])
    want = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (x, x, x)))
    got = fn(x, x, x, off, off, NONE, NONE, 16 ** -0.5, False)
    assert (got - want.transpose(0, 1)).abs().max().item() < 2e-5


def test_kernel_refuses_what_it_cannot_do(kernel):
    x = torch.randn(4, 2, 24)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kernel(x, x, x, torch.tensor([0, 4]), torch.tensor([0, 4]), NONE, NONE, 1.0, False)
    with pytest.raises(RuntimeError, match="float32 only"):
        y = torch.randn(4, 2, 32, dtype=torch.bfloat16)
        kernel(y, y, y, torch.tensor([0, 4]), torch.tensor([0, 4]), NONE, NONE, 1.0, False)
    with pytest.raises(RuntimeError, match="more queries than keys"):
        kernel(x[:, :, :16], x[:2, :, :16], x[:2, :, :16], torch.tensor([0, 4]),
               torch.tensor([0, 2]), NONE, NONE, 1.0, True)


@pytest.mark.parametrize("fixture", ["bert_embed_dir", "qwen3_embed_dir"])
def test_engine_same_with_and_without_kernel(request, kernel, monkeypatch, fixture):
    from vllm import LLM
    path = request.getfixturevalue(fixture)
    prompts = ["short", "a somewhat longer prompt that spans more tokens " * 3, "mid length x"]
    with_kernel = [o.outputs.embedding for o in LLM(path).embed(prompts)]
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TORCH_SDPA")
    without = [o.outputs.embedding for o in LLM(path).embed(prompts)]
    np.testing.assert_allclose(np.array(with_kernel), np.array(without), atol=2e-6)


def _rms_reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.double()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [40, 128, 1024])
def test_rms_norm_kernel_matches_torch(width, dtype):
    """Equal to Hugging Face's formula: float32 within rounding; bfloat16 rounded where
    Hugging Face rounds (the normalised row, then the product with the weight)."""
    kernel = cpu_kernels.rms_norm_kernel()
    assert kernel is not None, cpu_kernels.kernel_status("rms_norm")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(width, generator=g).to(dtype)
    fused = (torch.randn(37, 5 * width, generator=g) * 3).to(dtype)
    # rows of a plain matrix, and q / k heads split out of a fused projection (strided)
    for x, eps in ((fused[:, :width].contiguous(), 1e-6),
                   (fused[:, width: 4 * width].reshape(37, 3, width), 1e-5)):
        got = kernel(x, w, eps)
        assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous()
        h = x.double()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        if dtype == torch.float32:
            assert (got.double() - h * w.double()).abs().max().item() < 1e-5
        else:  # Hugging Face: weight * h.to(bfloat16), both rounded to bfloat16
            want = w * h.to(dtype)
            assert (got.float() - want.float()).abs().max().item() <= \
                want.float().abs().max().item() / 64  # at most an ulp or two apart


def test_rms_norm_kernel_refuses_what_it_cannot_do():
    kernel = cpu_kernels.rms_norm_kernel()
    with pytest.raises(RuntimeError, match="float32 or bfloat16 only"):
        kernel(torch.randn(2, 8, dtype=torch.float16), torch.ones(8, dtype=torch.float16), 1e-6)
    with pytest.raises(RuntimeError, match="weight must have x's dtype"):
        kernel(torch.randn(2, 8), torch.ones(8, dtype=torch.bfloat16), 1e-6)
    with pytest.raises(RuntimeError, match="contiguous \\[D\\] vector"):
        kernel(torch.randn(2, 8), torch.ones(4), 1e-6)
    with pytest.raises(RuntimeError, match="unit stride"):
        kernel(torch.randn(8, 2).t(), torch.ones(8), 1e-6)


@pytest.mark.parametrize("dtype,atol", [("float32", 2e-6), ("bfloat16", 4e-3)])
def test_engine_same_with_and_without_rms_norm_kernel(qwen3_embed_dir, monkeypatch, dtype,
                                                      atol):
    from vllm import LLM
    prompts = ["short", "a somewhat longer prompt that spans more tokens " * 3]
    calls = []
    kernel = cpu_kernels.rms_norm_kernel()
    monkeypatch.setattr(cpu_kernels, "rms_norm_kernel", lambda: calls.append(1) or kernel)
    with_kernel = [o.outputs.embedding
                   for o in LLM(qwen3_embed_dir, dtype=dtype).embed(prompts)]
    assert calls, "the decoder did not use the RMSNorm kernel"
    monkeypatch.setattr(cpu_kernels, "rms_norm_kernel", lambda: None)
    without = [o.outputs.embedding for o in LLM(qwen3_embed_dir, dtype=dtype).embed(prompts)]
    np.testing.assert_allclose(np.array(with_kernel), np.array(without), atol=atol)


def test_bf16_attention_kernel_status_says_why_it_is_missing(monkeypatch):
    """The bfloat16 attention kernel (csrc/varlen_attention_bf16.cpp) is offered only where
    the library was built with AVX512-BF16 and the CPU has it; otherwise None, and its status
    says which is missing, as the VNNI kernel's does."""
    lib = cpu_kernels.library()
    built = lib is not None and hasattr(lib, "vllm_varlen_attention_bf16") and \
        lib.vllm_varlen_attention_bf16_built()
    if not built:
        assert cpu_kernels.varlen_attention_bf16_kernel() is None
        assert "built without it" in cpu_kernels.kernel_status("varlen_attention_bf16")
        return
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: {"avx512f", "avx512bw"})
    assert cpu_kernels.varlen_attention_bf16_kernel() is None
    assert cpu_kernels.kernel_status("varlen_attention_bf16") == \
        "unavailable (this CPU has no AVX512-BF16)"


def test_bf16_model_without_the_bf16_kernel_casts_for_the_float32_one(minilm_dir, monkeypatch):
    """Where the bf16 kernel is missing, a bfloat16 model's CPU_NATIVE attention runs the
    float32 kernel on float32 copies: same embeddings as with the bf16 kernel (or, where it
    is missing anyway, as float32) to cosine 0.9999."""
    from vllm import LLM
    from vllm.attention.backends import cpu_native
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    texts = ["short", "a somewhat longer prompt that spans more tokens " * 6]
    default = [o.outputs.embedding for o in LLM(minilm_dir, dtype="bfloat16").embed(texts)]
    monkeypatch.setattr(cpu_native, "varlen_attention_bf16_kernel", lambda: None)
    cast = [o.outputs.embedding for o in LLM(minilm_dir, dtype="bfloat16").embed(texts)]
    a, b = np.array(default, np.float64), np.array(cast, np.float64)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() >= 0.9999
