"""TRITON_ATTN: its Triton kernels against a float64 torch reference, and whole tiny models
through it equal to Transformers.

The kernels run compiled on a GPU and in Triton's interpreter on the CPU
(tests/triton_interpret.py). Launch counters (`launches` in each kernel module) show the
kernels ran, so no test passes on a fallback path: the whole-model tests also count the
pooling kernel (tests/test_triton_pooling.py tests it on its own).
"""
from __future__ import annotations

import importlib
import random

import pytest
import torch

import model_factory as mf
from triton_interpret import DEVICE, kernel_modules
from vllm.attention.metadata import AttentionMetadata, token_slots

triton = pytest.importorskip("triton")

COS_MIN = 0.9999
PROB_TOL = 1e-4
# dtype -> (atol, rtol) against the float64 reference (outputs are O(1))
TOL = {torch.float32: (2e-5, 1e-5), torch.float16: (3e-3, 3e-3),
       torch.bfloat16: (2e-2, 1.6e-2)}
KERNELS = ("vllm.attention.ops.triton_attention", "vllm.attention.ops.triton_kv_cache",
           "vllm.attention.ops.triton_pooling")


@pytest.fixture(scope="module", autouse=True)
def kernels():
    """The kernel modules, in the mode this machine runs (interpreter on the CPU)."""
    with kernel_modules(KERNELS) as mods:
        yield mods


@pytest.fixture
def triton_backend(monkeypatch):
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")


def _launches() -> dict:
    attn, cache, pool = (importlib.import_module(n) for n in KERNELS)
    return {"attention": attn.launches["varlen_attention"],
            "write_kv": cache.launches["write_kv"], "pool": pool.launches["pool_rows"]}


# ----------------------------------------------------------------------- kernels

class _Layer:
    """What a backend reads from an attention layer."""

    def __init__(self, hq, hkv, d, cache=None, window=None, softcap=None):
        self.num_heads, self.num_kv_heads, self.head_dim = hq, hkv, d
        self.scale, self.kv_cache, self.window, self.softcap = d ** -0.5, cache, window, softcap


def _batch(seed: int, causal: bool, bs: int, readers: bool):
    """Ragged requests, readers first: a prefix ending inside a block, one of exactly a
    block, and requests with an empty prefix."""
    rng = random.Random(seed)
    cached = [bs + rng.randrange(1, bs), bs, 0, 0] if causal and readers else [0, 0, 0]
    new = [rng.randrange(1, 40) for _ in cached]
    free = list(range(64))
    rng.shuffle(free)
    tables = []
    for c, n in zip(cached, new):
        count = -(-(c + n) // bs)
        tables.append(free[:count])
        free = free[count:]
    starts = [0]
    for n in new:
        starts.append(starts[-1] + n)
    slots = torch.cat([token_slots(t, c, c + n, bs) for t, c, n in zip(tables, cached, new)])
    return AttentionMetadata(starts, cached, new, slots.to(DEVICE), tables, bs, causal,
                             torch.device(DEVICE))


def _reference(layer: _Layer, q, k, v, meta: AttentionMetadata) -> torch.Tensor:
    """Float64, one request at a time, keys of cache readers read back from their slots."""
    out = torch.empty(q.shape, dtype=torch.float64)
    group = layer.num_heads // layer.num_kv_heads
    for i in range(meta.num_reqs):
        s, e, c = meta.query_start_loc[i], meta.query_start_loc[i + 1], meta.num_computed[i]
        slots = token_slots(meta.block_tables[i], 0, c, meta.block_size).to(q.device)
        keys = torch.cat([layer.kv_cache[0][slots], k[s:e]]) if c else k[s:e]
        values = torch.cat([layer.kv_cache[1][slots], v[s:e]]) if c else v[s:e]
        keys = keys.double().cpu().repeat_interleave(group, 1)
        values = values.double().cpu().repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q[s:e].double().cpu(), keys) * layer.scale
        if layer.softcap is not None:
            scores = layer.softcap * torch.tanh(scores / layer.softcap)
        dist = torch.arange(c + e - s)[None, :] - torch.arange(c, c + e - s)[:, None]
        keep = dist <= 0 if meta.causal else torch.ones_like(dist, dtype=torch.bool)
        if layer.window is not None:
            keep &= (dist >= -layer.window[0]) & (dist <= layer.window[1])
        scores = scores.masked_fill(~keep, float("-inf"))
        out[s:e] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)
    return out


def _run_backend(dtype, d, bs, hq, hkv, causal, seed, window=None, softcap=None):
    """The backend's write + attention on random data vs the float64 reference."""
    from vllm.attention.backends.registry import get_backend
    backend = get_backend("TRITON_ATTN")
    meta = _batch(seed, causal, bs, readers=causal)
    gen = torch.Generator().manual_seed(seed)
    t = meta.query_start_loc[-1]

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)
    cache = rand(2, 64 * bs, hkv, d) if causal else None
    layer = _Layer(hq, hkv, d, cache, window, softcap)
    q, k, v = rand(t, hq, d), rand(t, hkv, d), rand(t, hkv, d)
    before = _launches()
    if cache is not None:
        backend.write_kv(layer, k, v, meta)
        assert torch.equal(cache[0][meta.slot_mapping], k)
        assert torch.equal(cache[1][meta.slot_mapping], v)
    got = backend.forward(layer, q, k, v, meta)
    after = _launches()
    assert after["attention"] == before["attention"] + 1
    assert after["write_kv"] == before["write_kv"] + (cache is not None)
    want = _reference(layer, q, k, v, meta)
    atol, rtol = TOL[dtype]
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.double().cpu(), want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("d", [64, 80, 128])
@pytest.mark.parametrize("bs", [16, 32])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_attention_matches_float64_reference(dtype, d, bs, causal):
    seed = d + bs + 1000 * causal + 7 * str(dtype).__len__()
    _run_backend(dtype, d, bs, 4, 2 if d != 80 else 1, causal, seed)


@pytest.mark.parametrize("window,softcap", [((5, 0), None), ((100, 0), None), (None, 2.0),
                                            ((7, 0), 1.0)],
                         ids=["window<prompt", "window>prompt", "softcap", "both"])
def test_causal_window_and_softcap(window, softcap):
    _run_backend(torch.float32, 64, 16, 4, 2, True, 7, window, softcap)


@pytest.mark.parametrize("window,softcap", [((6, 6), None), ((3, 9), 3.0), ((64, 64), None)],
                         ids=["symmetric", "asymmetric+softcap", "window>prompt"])
def test_bidirectional_window_and_softcap(window, softcap):
    _run_backend(torch.float32, 80, 16, 2, 2, False, 11, window, softcap)


def test_write_kv_skips_negative_slots(kernels):
    cache_ops = kernels[1]
    k = torch.randn(3, 2, 80, device=DEVICE)
    v = torch.randn(3, 2, 80, device=DEVICE)
    cache = torch.zeros(2, 32, 2, 80, device=DEVICE)
    cache_ops.write_kv(k, v, cache, torch.tensor([5, -1, 17], device=DEVICE))
    assert torch.equal(cache[0, [5, 17]], k[[0, 2]]) and torch.equal(cache[1, [5, 17]], v[[0, 2]])
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[[5, 17]] = False
    assert not cache[:, untouched].any()


def test_layout_tiles_and_reader_tables():
    from vllm.attention.backends.triton_attn import build_triton_metadata
    meta = AttentionMetadata([0, 5, 8, 45], [32, 16, 0], [5, 3, 37], None,
                             [[4, 9, 2], [4, 7], [1, 3, 6]], 16)
    data = build_triton_metadata(meta, 16, 16)
    assert data.tile_req.tolist() == [0, 1, 2, 2, 2]
    assert data.tile_start.tolist() == [0, 0, 0, 16, 32]
    assert data.block_tables.tolist() == [[4, 9], [4, 0]]   # the blocks holding k only
    assert data.q_start.tolist() == [0, 5, 8] and data.num_cached.tolist() == [32, 16, 0]


# ------------------------------------------------------------------- selection

def test_cpu_refuses_triton_attn_without_the_interpreter(monkeypatch):
    from vllm.platforms.cpu import CpuPlatform
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_ATTN cannot run here: .*TRITON_INTERPRET=1"):
        CpuPlatform("cpu").attention_backend(torch.float32, [64])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert CpuPlatform("cpu").attention_backend(torch.float32, [80]) == "TRITON_ATTN"
    with pytest.raises(ValueError, match="head size 512 is above 256"):
        CpuPlatform("cpu").attention_backend(torch.float32, [512])
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND")
    assert CpuPlatform("cpu").attention_backend(torch.float32, [64]) != "TRITON_ATTN"


def test_engine_refuses_triton_attn_on_cpu_without_the_interpreter(monkeypatch,
                                                                   bert_embed_dir):
    from vllm import LLM
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_ATTN cannot run here"):
        LLM(bert_embed_dir, device="cpu")


def _fake_cuda(monkeypatch):
    """A CudaPlatform on an H200-like device (compute 9.0, flash attention in torch),
    no GPU needed for its choice."""
    from vllm.platforms.cuda import CudaPlatform
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    cuda = CudaPlatform.__new__(CudaPlatform)
    cuda.device = torch.device("cuda", 0)
    return cuda


def test_cuda_default_is_triton_attn_for_cache_readers(monkeypatch, caplog):
    """CUDA: TRITON_ATTN for a model whose steps can hold cache readers, FLASH_ATTN
    otherwise, each in one INFO line with the reason; VLLM_ATTENTION_BACKEND wins."""
    import logging

    import vllm.platforms.cuda as cuda_module
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    cuda = _fake_cuda(monkeypatch)
    with caplog.at_level(logging.INFO, logger="vllm.platforms.interface"):
        assert cuda.attention_backend(torch.float16, [64], cache_readers=True) == "TRITON_ATTN"
        assert cuda.attention_backend(torch.bfloat16, [128]) == "FLASH_ATTN"
    lines = [r.getMessage() for r in caplog.records if "Attention backend" in r.getMessage()]
    assert len(lines) == 2
    assert lines[0].startswith("Attention backend: TRITON_ATTN (CUDA default for causal "
                               "attention with prefix caching or chunked prefill")
    assert lines[1] == ("Attention backend: FLASH_ATTN (CUDA default for a model without "
                        "cache readers).")
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "FLASH_ATTN")
    assert cuda.attention_backend(torch.float16, [64], cache_readers=True) == "FLASH_ATTN"
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    assert cuda.attention_backend(torch.float16, [64]) == "TRITON_ATTN"
    # Where Triton cannot run, cache readers fall back to flash attention, saying why.
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND")
    monkeypatch.setattr(cuda_module, "triton_attn_unavailable",
                        lambda dtype, dims: "triton is not installed")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vllm.platforms.interface"):
        assert cuda.attention_backend(torch.float16, [64], cache_readers=True) == "FLASH_ATTN"
    assert caplog.records[-1].getMessage() == (
        "Attention backend: FLASH_ATTN; not TRITON_ATTN: triton is not installed.")


def test_runner_tells_the_platform_about_cache_readers(monkeypatch, qwen3_embed_dir,
                                                       bert_embed_dir):
    """The engine asks for a backend with cache_readers true for a causal model with prefix
    caching / chunked prefill on, false for an encoder."""
    from vllm import LLM
    from vllm.platforms.cpu import CpuPlatform
    seen = []
    original = CpuPlatform.default_backends

    def record(self, dtype, cache_readers):
        seen.append(cache_readers)
        return original(self, dtype, cache_readers)
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    monkeypatch.setattr(CpuPlatform, "default_backends", record)
    LLM(qwen3_embed_dir, dtype="float32")
    LLM(qwen3_embed_dir, dtype="float32", enable_prefix_caching=False,
        enable_chunked_prefill=False)
    LLM(bert_embed_dir, dtype="float32")
    assert seen == [True, False, False]


# ---------------------------------------------------------------- whole models

def _check_launches(before: dict, llm, cache_writes: bool, pooled: bool) -> None:
    """Attention ran once per layer per step, the KV write with it where a cache is kept,
    and the pooling kernel where the step pooled rows or normalized embeddings (LAST and
    CLS rows are picked by the model's last layer; a classifier normalizes nothing)."""
    after = _launches()
    layers = len(llm.llm_engine.runner.model.model.attention_layers())
    ran = after["attention"] - before["attention"]
    assert llm.llm_engine.runner.attention_backend == "TRITON_ATTN"
    assert ran > 0 and ran % layers == 0
    assert after["write_kv"] - before["write_kv"] == (ran if cache_writes else 0)
    assert (after["pool"] > before["pool"]) == pooled


def test_qwen3_last_with_prefix_cache_and_chunks(triton_backend, qwen3_embed_dir):
    from vllm import LLM
    rng = random.Random(0)
    prefix = [rng.randrange(4, 480) for _ in range(40)]
    prompts = [prefix + [rng.randrange(4, 480) for _ in range(rng.randrange(3, 30))]
               for _ in range(4)]
    before = _launches()
    llm = LLM(qwen3_embed_dir, dtype="float32", block_size=16, max_num_batched_tokens=32)
    cfg = llm.llm_engine.vllm_config
    assert cfg.cache_config.enable_prefix_caching and cfg.scheduler_config.enable_chunked_prefill
    batch = [{"prompt_token_ids": p} for p in prompts]
    first = llm.embed(batch, use_tqdm=False)
    second = llm.embed(batch, use_tqdm=False)
    _check_launches(before, llm, cache_writes=True, pooled=True)
    assert all(o.num_cached_tokens > 0 for o in second)
    for ids, a, b in zip(prompts, first, second):
        ref = mf.hf_embedding(qwen3_embed_dir, ids, "LAST", normalize=True)
        assert mf.cosine(a.outputs.embedding, ref) >= COS_MIN
        assert mf.cosine(b.outputs.embedding, a.outputs.embedding) >= 0.999999


def test_qwen2_bidirectional_mean(triton_backend, qwen2_bidir_dir):
    from vllm import LLM
    before = _launches()
    llm = LLM(qwen2_bidir_dir, dtype="float32", pooler_config={"pooling_type": "MEAN"})
    prompts = mf.mixed_prompts(mf.hf_tokenizer(qwen2_bidir_dir), lengths=(3, 45, 17))
    outs = llm.embed(prompts, use_tqdm=False)
    _check_launches(before, llm, cache_writes=False, pooled=True)
    for out in outs:
        ref = mf.hf_embedding(qwen2_bidir_dir, out.prompt_token_ids, "MEAN", normalize=True,
                              bidirectional=True)
        assert mf.cosine(out.outputs.embedding, ref) >= COS_MIN


def test_bert_classifier(triton_backend, bert_cls_dir):
    from vllm import LLM
    before = _launches()
    llm = LLM(bert_cls_dir, dtype="float32")
    prompts = mf.mixed_prompts(mf.hf_tokenizer(bert_cls_dir), lengths=(3, 40, 17))
    outs = llm.classify(prompts, use_tqdm=False)
    _check_launches(before, llm, cache_writes=False, pooled=False)
    for out in outs:
        want = mf.probs_from_logits(mf.hf_seqcls_logits(bert_cls_dir, out.prompt_token_ids))
        assert mf.max_abs_diff(out.outputs.probs, want) <= PROB_TOL


def test_minilm_matches_sentence_transformers(triton_backend, minilm_dir):
    from vllm import LLM
    before = _launches()
    llm = LLM(minilm_dir, dtype="float32")
    sentences = ["A cat sits on the mat.", "Paged attention reads keys in place.",
                 "Short."]
    outs = llm.embed(sentences, use_tqdm=False)
    _check_launches(before, llm, cache_writes=False, pooled=True)
    for out, ref in zip(outs, mf.st_encode(minilm_dir, sentences)):
        assert mf.cosine(out.outputs.embedding, ref) >= COS_MIN


def test_gemma2_window_and_softcap_stay_in_the_kernel(triton_backend, monkeypatch,
                                                      gemma2_embed_dir):
    """Gemma 2 (12-token window, softcap 1) with cache readers and chunks: never the masked
    path, and equal to eager Transformers."""
    import family_models as fm
    from vllm import LLM
    from vllm.model_executor.layers import attention

    def refuse(*args, **kwargs):
        raise AssertionError("TRITON_ATTN steps must not take the masked path")
    monkeypatch.setattr(attention, "masked_attention", refuse)
    llm = LLM(gemma2_embed_dir, dtype="float32", block_size=16,
              max_num_batched_tokens=32)
    prefix = mf.text_of_length(mf.hf_tokenizer(gemma2_embed_dir), 40)
    outs = llm.embed([prefix + " red river"], use_tqdm=False)
    outs += llm.embed([prefix + " blue house"], use_tqdm=False)
    assert outs[1].num_cached_tokens > 0
    for out in outs:
        ref = fm.hf_hidden(gemma2_embed_dir, out.prompt_token_ids)[-1]
        assert mf.cosine(out.outputs.embedding, ref) >= COS_MIN
