"""The bfloat16 attention kernel (csrc/varlen_attention_bf16.cpp, AVX512-BF16) against a
float64 reference on the same bfloat16 inputs, and the engine's bfloat16 models on it.

Tolerances, from what the kernel rounds:
- Q*K^T products of bf16 values are exact in float32 and summed in float32, the softmax and
  the output accumulation are float32, and by default P*V runs in float32 on float32 P: the
  float32 kernel's error, ~1e-6 relative (2e-5 absolute on these |v| <= ~10 inputs, as the
  float32 kernel's test);
- a bfloat16 output adds one rounding: half an ulp, at most 2^-8 relative (8 significand
  bits);
- bf16_pv rounds each weight P by at most 2^-8 relative; the kernel normalises by the sum of
  the rounded weights, so each normalised weight moves by at most ~2 * 2^-8 of itself and
  the output (a convex combination of V rows) by at most 2^-7 max|v|.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vllm._kernels import cpu_kernels

NONE = torch.empty(0, dtype=torch.long)
FP32_ATOL = 2e-5


def _kernel():
    return cpu_kernels.varlen_attention_bf16_kernel()


pytestmark = pytest.mark.skipif(
    _kernel() is None,
    reason=f"bfloat16 attention kernel: {cpu_kernels.kernel_status('varlen_attention_bf16')}")


@pytest.fixture(scope="module")
def kernel():
    return _kernel()


def _qkv(lengths, hq, hkv, d, seed):
    """bf16 q, k, v as strided views of one fused projection output, as the models make."""
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    qkv = (torch.randn(t, (hq + 2 * hkv) * d, generator=g) * 2).bfloat16()
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return tuple(x.view(t, -1, d) for x in (q, k, v))


def _reference(q, k, v, nqs, nks, causal, scale):
    """float64 SDPA per sequence on the same bf16 values; queries are the last keys."""
    out, qs, ks = [], 0, 0
    for nq, nk in zip(nqs, nks):
        qq = q[qs: qs + nq].transpose(0, 1)[None].double()
        kk, vv = (x[ks: ks + nk].transpose(0, 1)[None].double() for x in (k, v))
        mask = torch.arange(nk)[None, :] <= (nk - nq + torch.arange(nq))[:, None]
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask if causal else None,
                                           scale=scale, enable_gqa=True)
        out.append(o[0].transpose(0, 1))
        qs, ks = qs + nq, ks + nk
    return torch.cat(out)


def _assert_close(got, want, v, out_dtype, bf16_pv):
    err = (got.double() - want).abs()
    bound = torch.full_like(want, FP32_ATOL)
    if bf16_pv:
        bound += 2 ** -7 * v.double().abs().max()
    if out_dtype == torch.bfloat16:   # half an ulp of the (already perturbed) value
        bound += 2 ** -8 * (want.abs() + bound)
    assert (err <= bound).all(), f"max error {err.max().item():.3g}, worst excess " \
        f"{(err - bound).max().item():.3g}"


@pytest.mark.parametrize("head_dim", [32, 48, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bf16_pv", [False, True])
def test_ragged_gqa_matches_float64(kernel, head_dim, causal, bf16_pv):
    # last key blocks of every length class of 16 (keys past a block's end are not scored)
    lengths = [1, 7, 17, 33, 50, 64, 65, 127, 130, 300]
    q, k, v = _qkv(lengths, 4, 2, head_dim, seed=head_dim + causal)
    off = torch.tensor(np.cumsum([0] + lengths))
    scale = head_dim ** -0.5
    want = _reference(q, k, v, lengths, lengths, causal, scale)
    for out_dtype in (torch.float32, torch.bfloat16):
        got = kernel(q, k, v, off, off, NONE, NONE, scale, causal, out_dtype, bf16_pv)
        assert got.dtype == out_dtype and got.shape == q.shape and got.is_contiguous()
        _assert_close(got, want, v, out_dtype, bf16_pv)


@pytest.mark.parametrize("causal", [False, True])
def test_queries_after_a_cached_prefix(kernel, causal):
    """nq new queries over nk keys: query i sits at key nk - nq + i."""
    nqs, nks = [1, 40, 70, 3], [17, 40, 200, 131]
    g = torch.Generator().manual_seed(7)
    q = torch.randn(sum(nqs), 8, 64, generator=g).bfloat16()
    k, v = (torch.randn(sum(nks), 2, 64, generator=g).bfloat16() for _ in range(2))
    qo, ko = torch.tensor(np.cumsum([0] + nqs)), torch.tensor(np.cumsum([0] + nks))
    got = kernel(q, k, v, qo, ko, NONE, NONE, 0.125, causal, torch.float32)
    _assert_close(got, _reference(q, k, v, nqs, nks, causal, 0.125), v, torch.float32, False)


def test_keys_through_slots_of_a_bf16_cache_with_shared_tiles(kernel):
    """Keys straight from a paged bf16 cache (key_rows), a 150-key prefix shared by 3
    sequences (its full 64-key tiles named once in tile_ids): equal to the same call on
    gathered keys, and to float64 SDPA."""
    g = torch.Generator().manual_seed(3)
    hq, hkv, d, slots = 4, 2, 32, 1024
    cache_k, cache_v = (torch.randn(slots, hkv, d, generator=g).bfloat16() for _ in range(2))
    prefix = torch.randperm(slots, generator=g)[:150]
    rows = [torch.cat([prefix, o]) for o in torch.randperm(slots, generator=g)[:60].split(
        [10, 20, 30])]
    nqs, nks = [10, 20, 30], [len(r) for r in rows]
    tiles, ids = {}, []
    for r in rows:
        for t in range(0, len(r), 64):
            ids.append(tiles.setdefault(r[t: t + 64].numpy().tobytes(), len(tiles)))
    assert len(tiles) == 2 + 3                       # two shared full tiles, one own each
    q = torch.randn(sum(nqs), hq, d, generator=g).bfloat16()
    qo, ko = torch.tensor(np.cumsum([0] + nqs)), torch.tensor(np.cumsum([0] + nks))
    flat = torch.cat(rows)
    for bf16_pv in (False, True):
        got = kernel(q, cache_k, cache_v, qo, ko, flat, torch.tensor(ids), 0.2, True,
                     torch.float32, bf16_pv)
        k, v = cache_k[flat], cache_v[flat]
        assert torch.equal(got, kernel(q, k, v, qo, ko, NONE, NONE, 0.2, True, torch.float32,
                                       bf16_pv))
        _assert_close(got, _reference(q, k, v, nqs, nks, True, 0.2), v, torch.float32, bf16_pv)


@pytest.mark.parametrize("head_dim", [32, 48, 128])
def test_float32_inputs_are_rounded_where_the_kernel_copies_them(kernel, head_dim):
    """float32 q/k/v (an int8 model's): with bf16_pv the kernel rounds all three to bf16,
    so it equals itself on their casts bit for bit; without, V stays float32 and only the
    scores see bf16 q and k, so it matches float64 on (q, k rounded, v) to the float32
    kernel's error. Also through slots of a float32 cache (key_rows)."""
    lengths = [1, 9, 64, 65, 200]
    g = torch.Generator().manual_seed(head_dim)
    t, hq, hkv = sum(lengths), 4, 2
    qkv = torch.randn(t, (hq + 2 * hkv) * head_dim, generator=g) * 2
    q, k, v = (x.view(t, -1, head_dim) for x in qkv.split(
        [hq * head_dim, hkv * head_dim, hkv * head_dim], dim=-1))
    off, scale = torch.tensor(np.cumsum([0] + lengths)), head_dim ** -0.5
    cast = [x.bfloat16() for x in (q, k, v)]
    for causal in (False, True):
        got = kernel(q, k, v, off, off, NONE, NONE, scale, causal, torch.float32, True)
        assert torch.equal(got, kernel(*cast, off, off, NONE, NONE, scale, causal,
                                       torch.float32, True))
        got = kernel(q, k, v, off, off, NONE, NONE, scale, causal, torch.float32)
        want = _reference(cast[0].float(), cast[1].float(), v, lengths, lengths, causal, scale)
        _assert_close(got, want, v, torch.float32, False)
    slots = torch.randperm(2 * t, generator=g)[:t]
    cache_k, cache_v = torch.zeros(2 * t, hkv, head_dim), torch.zeros(2 * t, hkv, head_dim)
    cache_k[slots], cache_v[slots] = k, v
    for bf16_pv in (False, True):
        assert torch.equal(
            kernel(q, cache_k, cache_v, off, off, slots, NONE, scale, True, torch.float32,
                   bf16_pv),
            kernel(q, k, v, off, off, NONE, NONE, scale, True, torch.float32, bf16_pv))


def test_refuses_what_it_cannot_do(kernel):
    x = torch.randn(4, 2, 32)
    off = torch.tensor([0, 4])
    with pytest.raises(RuntimeError, match="all bfloat16 or all float32"):
        kernel(x, x.bfloat16(), x, off, off, NONE, NONE, 1.0, False)
    with pytest.raises(RuntimeError, match="all bfloat16 or all float32"):
        kernel(x.half(), x.half(), x.half(), off, off, NONE, NONE, 1.0, False)
    y = torch.randn(4, 2, 24).bfloat16()
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kernel(y, y, y, off, off, NONE, NONE, 1.0, False)
    with pytest.raises(RuntimeError, match="out_dtype"):
        kernel(x.bfloat16(), x.bfloat16(), x.bfloat16(), off, off, NONE, NONE, 1.0, False,
               torch.float16)


def _counting(monkeypatch):
    """Counts the backend's uses of the bf16 kernel."""
    from vllm.attention.backends import cpu_native
    calls, real = [], cpu_native.varlen_attention_bf16_kernel
    monkeypatch.setattr(cpu_native, "varlen_attention_bf16_kernel",
                        lambda: calls.append(1) or real())
    return calls


def _cosines(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_minilm_bf16_embeddings_within_cosine_9999_of_float32(minilm_dir, monkeypatch):
    from vllm import LLM
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, n)) for n in (3, 17, 40, 90, 160, 200)]
    calls = _counting(monkeypatch)
    bf16 = [o.outputs.embedding for o in LLM(minilm_dir, dtype="bfloat16").embed(texts)]
    assert calls, "CPU_NATIVE did not run the bfloat16 kernel"
    fp32 = [o.outputs.embedding for o in LLM(minilm_dir, dtype="float32").embed(texts)]
    assert _cosines(bf16, fp32).min() >= 0.9999


def test_int8_models_run_attention_in_bf16(minilm_dir, shared_llm, monkeypatch, vllm_log):
    """quantization="int8" on a CPU with AVX512-BF16: attention on the bf16 kernel (logged;
    VLLM_CPU_INT8_BF16_ATTENTION=0 keeps the float32 kernel), as close to float32 as int8
    with float32 attention. (The two int8 runs are only ~0.995 apart: any change of an
    activation moves the rows' int8 rounding, so each is another draw of the int8 noise; the
    float32 model with bf16 attention stays within 1e-5 of itself.)"""
    from vllm import LLM
    from vllm.model_executor.layers.attention import Attention
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()
    rng = np.random.default_rng(2)
    texts = [" ".join(rng.choice(words, n)) for n in (3, 17, 40, 90, 160, 200)] * 2
    fp32 = [o.outputs.embedding for o in shared_llm(minilm_dir).embed(texts, use_tqdm=False)]
    cos = {}
    for on in (True, False):
        monkeypatch.setenv("VLLM_CPU_INT8_BF16_ATTENTION", "1" if on else "0")
        llm = LLM(minilm_dir, quantization="int8")
        layers = [m for m in llm.llm_engine.runner.model.modules() if isinstance(m, Attention)]
        assert len(layers) == 6 and all(m.bf16_ok == m.bf16_pv == on for m in layers)
        calls = _counting(monkeypatch)
        cos[on] = _cosines([o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)],
                           fp32)
        assert bool(calls) == on
    assert "int8 attention: bfloat16 q/k/v" in vllm_log.text
    assert "int8 attention: float32 (VLLM_CPU_INT8_BF16_ATTENTION=0)" in vllm_log.text
    assert cos[True].min() >= 0.99 and cos[True].mean() >= cos[False].mean() - 1e-3, cos


def test_int8_bert_hands_its_qkv_over_in_bf16(minilm_dir, monkeypatch):
    """Where an int8 model's attention rounds q/k/v to bf16 itself and keeps no cache
    (`Attention.rounds_to_bf16`), BERT's qkv projection rounds them in its own pass
    (`Linear.forward_bf16`): the same embeddings bit for bit as float32 q/k/v rounded in
    the kernel, attention output float32."""
    from vllm import LLM
    from vllm.model_executor.layers import int8_linear as i8
    from vllm.model_executor.layers.attention import Attention
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    monkeypatch.setenv("VLLM_CPU_INT8_BF16_ATTENTION", "1")
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()
    rng = np.random.default_rng(3)
    texts = [" ".join(rng.choice(words, n)) for n in (1, 5, 17, 40, 90, 200)]
    llm = LLM(minilm_dir, quantization="int8")
    calls, real = [], i8.Int8Gemm.linear_bf16
    monkeypatch.setattr(i8.Int8Gemm, "linear_bf16",
                        lambda self, *a: calls.append(1) or real(self, *a))
    handed = [o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)]
    assert len(calls) == 6  # one per layer: a single step
    monkeypatch.setattr(Attention, "rounds_to_bf16", lambda self: False)
    rounded_in_kernel = [o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)]
    assert len(calls) == 6
    np.testing.assert_array_equal(np.array(handed), np.array(rounded_in_kernel))


def test_int8_bert_cross_encoder_with_bf16_qkv(bert_cls_dir, shared_llm, monkeypatch):
    """A BERT cross-encoder in int8 (CLS pooling: the last layer keeps only the pooled rows
    after attention) with its qkv handed over in bf16: scores equal to the same engine's
    with float32 q/k/v rounded in the kernel bit for bit, and near float32's."""
    from vllm import LLM
    from vllm.model_executor.layers import int8_linear as i8
    from vllm.model_executor.layers.attention import Attention
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    monkeypatch.setenv("VLLM_CPU_INT8_BF16_ATTENTION", "1")
    pairs = [("what is a cat", "a cat is a small furry animal that purrs"),
             ("capital of france", "paris is the capital of france"),
             ("how do planes fly", "the stock market fell sharply on monday")]
    f32 = [o.outputs.score for o in shared_llm(bert_cls_dir).score(*zip(*pairs))]
    llm = LLM(bert_cls_dir, quantization="int8")
    calls, real = [], i8.Int8Gemm.linear_bf16
    monkeypatch.setattr(i8.Int8Gemm, "linear_bf16",
                        lambda self, *a: calls.append(1) or real(self, *a))
    handed = [o.outputs.score for o in llm.score(*zip(*pairs))]
    assert calls
    monkeypatch.setattr(Attention, "rounds_to_bf16", lambda self: False)
    assert [o.outputs.score for o in llm.score(*zip(*pairs))] == handed
    np.testing.assert_allclose(handed, f32, atol=0.01)


def test_qwen3_bf16_prefix_cached_pass_equals_the_first(qwen3_embed_dir, monkeypatch):
    """Causal GQA, head_dim 32: the second pass reads its prefix from the bf16 cache through
    the kernel's key_rows (no fallback to TORCH_SDPA) and equals the first."""
    from vllm import LLM
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    rng = np.random.default_rng(1)
    prefix = rng.integers(4, 480, 150).tolist()
    prompts = [{"prompt_token_ids": prefix + rng.integers(4, 480, n).tolist()}
               for n in (5, 33, 70)]
    llm = LLM(qwen3_embed_dir, dtype="bfloat16", block_size=16)
    calls = _counting(monkeypatch)
    first = llm.embed(prompts, use_tqdm=False)
    second = llm.embed(prompts, use_tqdm=False)
    assert calls
    assert all(o.num_cached_tokens >= 144 for o in second), \
        [o.num_cached_tokens for o in second]
    got, want = (np.array([o.outputs.embedding for o in x]) for x in (second, first))
    assert _cosines(got, want).min() >= 0.99999
    np.testing.assert_allclose(got, want, atol=2e-3)
