"""Prefix caching and chunked prefill through the public `LLM` API.

* Equivalence: a shuffled batch of prompts sharing long prefixes gives the same numbers
  with caching + chunking on (tiny budget, so chunk boundaries land everywhere) as with
  both off, and as Transformers — and the features really ran.
* Hits are real: a second pass reports the cached tokens; the last token is always
  recomputed; different blocks / salts never collide.
* Pressure: a KV pool for about two long prompts still finishes 50 requests exactly,
  evicting (and preempting) on the way.

Prompts are token ids (`{"prompt_token_ids": [...]}`) so lengths are exact. The BPE
fixtures (Qwen) have ids 0..479 with specials 0..3 (eos = pad = 0); the Llama fixture
uses a BERT vocabulary with pad 0. Ids are drawn away from the specials, so the
Transformers classifiers pool the real last token.
"""
from __future__ import annotations

import random

import pytest
import torch

import model_factory as mf
from vllm import LLM

COS_MIN = 0.9999
PROB_TOL = 1e-4
BLOCK = 16
ON = dict(max_num_batched_tokens=32, block_size=BLOCK)
OFF = dict(enable_prefix_caching=False, enable_chunked_prefill=False)

# fixture -> (task, lowest safe id, highest safe id + 1)
MODELS = {
    "qwen3_cls_dir": ("classify", 4, 480),
    "llama_cls_dir": ("classify", 1000, 29000),
    "qwen3_embed_dir": ("embed", 4, 480),
    "qwen2_embed_dir": ("embed", 4, 480),
}


class Tokens:
    """Deterministic random token ids in a model's safe range."""

    def __init__(self, fixture: str, seed: int) -> None:
        _, self.lo, self.hi = MODELS[fixture]
        self.rng = random.Random(seed)

    def __call__(self, n: int) -> list[int]:
        return [self.rng.randrange(self.lo, self.hi) for _ in range(n)]


def _run(llm: LLM, task: str, prompts: list[list[int]]):
    return getattr(llm, task)([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)


def _vec(task: str, out) -> torch.Tensor:
    return torch.tensor(out.outputs.probs if task == "classify" else out.outputs.embedding)


_REF_CACHE: dict = {}


def _reference(model_dir: str, task: str, ids: list[int]) -> torch.Tensor:
    key = (model_dir, tuple(ids))
    if key not in _REF_CACHE:
        if task == "classify":
            _REF_CACHE[key] = mf.probs_from_logits(mf.hf_seqcls_logits(model_dir, ids))
        else:
            _REF_CACHE[key] = mf.hf_embedding(model_dir, ids, "LAST", normalize=True)
    return _REF_CACHE[key]


def _assert_same(task: str, got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, what
    if task == "classify":
        assert mf.max_abs_diff(got, want) <= PROB_TOL, what
    else:
        assert mf.cosine(got, want) >= COS_MIN, what


def _off_llm(shared_llm, model_dir: str) -> LLM:
    llm = shared_llm(model_dir, **OFF)
    cfg = llm.llm_engine.vllm_config
    assert cfg.cache_config.enable_prefix_caching is False
    assert cfg.scheduler_config.enable_chunked_prefill is False
    return llm


# ------------------------------------------------------------------ equivalence

def _shared_prefix_batch(fixture: str, seed: int = 0) -> list[list[int]]:
    """Prompts of 100..300 tokens around two shared prefixes, plus strict prefixes, an
    exact duplicate and unrelated prompts, shuffled."""
    tok = Tokens(fixture, seed)
    p1, p2 = tok(150), tok(101)
    prompts = [p1 + tok(n) for n in (7, 50, 63, 150)]          # 157, 200, 213, 300
    prompts += [p1[:128], p1[:100], p1[:113] + tok(30)]         # strict prefixes of p1
    prompts += [p2 + tok(n) for n in (20, 99, 180)]             # 121, 200, 281
    prompts += [tok(111), tok(240)]                             # unrelated
    prompts.append(list(prompts[1]))                            # exact duplicate
    random.Random(seed + 1).shuffle(prompts)
    return prompts


@pytest.mark.parametrize("fixture", list(MODELS))
def test_caching_and_chunking_change_no_number(request, shared_llm, attention_backend,
                                               fixture):
    """Under each attention backend (CPU_NATIVE: the C++ kernel; TORCH_SDPA: the
    reference)."""
    model_dir = request.getfixturevalue(fixture)
    task = MODELS[fixture][0]
    prompts = _shared_prefix_batch(fixture)
    assert all(100 <= len(p) <= 300 for p in prompts)

    on = LLM(model_dir, **ON)
    assert on.llm_engine.runner.attention_backend == attention_backend
    cfg = on.llm_engine.vllm_config
    assert cfg.cache_config.enable_prefix_caching is True
    assert cfg.scheduler_config.enable_chunked_prefill is True
    assert cfg.scheduler_config.max_num_batched_tokens == 32
    assert cfg.cache_config.block_size == BLOCK
    off = _off_llm(shared_llm, model_dir)

    ref_off = _run(off, task, prompts)
    assert all(o.num_cached_tokens == 0 for o in ref_off)

    first = _run(on, task, prompts)
    stats = on.llm_engine.stats
    hits_first = stats.prefix_cache_hits
    assert stats.num_requests_finished == len(prompts)
    assert stats.num_split_requests > 0, stats       # requests spanned 2+ steps
    assert stats.num_steps >= sum(map(len, prompts)) // 32 // 2, stats
    assert any(o.num_cached_tokens > 0 for o in first), "no prefix hit in the caching run"
    # The exact duplicate is answered by its twin in flight (computed once, not looked up).
    unique = {tuple(p) for p in prompts}
    assert stats.num_deduplicated == len(prompts) - len(unique) == 1
    assert hits_first > 0 and stats.prefix_cache_queries >= sum(map(len, unique))

    # The second pass, in another order, hits much more.
    order = list(range(len(prompts)))
    random.Random(5).shuffle(order)
    second_prompts = [prompts[i] for i in order]
    second = _run(on, task, second_prompts)
    stats = on.llm_engine.stats  # read again: counters are refreshed on access
    assert stats.prefix_cache_hits - hits_first > hits_first
    for p, o in zip(second_prompts, second):
        assert o.num_cached_tokens == (len(p) - 1) // BLOCK * BLOCK, len(p)

    by_prompt_second = {tuple(p): o for p, o in zip(second_prompts, second)}
    for p, r_off, r_on in zip(prompts, ref_off, first):
        assert r_on.prompt_token_ids == p and r_off.prompt_token_ids == p
        assert 0 <= r_on.num_cached_tokens < len(p)
        want = _reference(model_dir, task, p)
        v_off, v_on = _vec(task, r_off), _vec(task, r_on)
        v_second = _vec(task, by_prompt_second[tuple(p)])
        _assert_same(task, v_off, want, f"off vs transformers, {len(p)} tokens")
        _assert_same(task, v_on, want, f"on vs transformers, {len(p)} tokens")
        _assert_same(task, v_on, v_off, f"on vs off, {len(p)} tokens")
        _assert_same(task, v_second, v_off, f"second pass vs off, {len(p)} tokens")


def test_no_cache_run_reports_no_features(shared_llm, qwen3_cls_dir):
    off = _off_llm(shared_llm, qwen3_cls_dir)
    before = (off.llm_engine.stats.prefix_cache_queries, off.llm_engine.stats.num_split_requests)
    prompts = _shared_prefix_batch("qwen3_cls_dir", seed=3)
    outs = _run(off, "classify", prompts + prompts)
    assert all(o.num_cached_tokens == 0 for o in outs)
    stats = off.llm_engine.stats
    assert (stats.prefix_cache_queries, stats.num_split_requests) == before == (0, 0)
    assert stats.prefix_cache_hits == 0


# ------------------------------------------------------------------ hits are real

@pytest.fixture(scope="module")
def embed_on(qwen3_embed_dir):
    """A caching LLM with the default budget (whole prompts in one step)."""
    return LLM(qwen3_embed_dir, block_size=BLOCK)


def test_second_pass_over_a_shared_200_token_prefix_hits(embed_on, shared_llm,
                                                         qwen3_embed_dir):
    tok = Tokens("qwen3_embed_dir", seed=11)
    prefix = tok(200)
    first = [prefix + tok(n) for n in (1, 9, 24, 40)]
    again = [prefix + tok(n) for n in (3, 17, 33, 56)]  # new documents, same prefix
    off = _off_llm(shared_llm, qwen3_embed_dir)

    outs1 = _run(embed_on, "embed", first)
    # Same step: later requests share the prefix the first one writes in that step.
    assert outs1[0].num_cached_tokens == 0
    assert all(o.num_cached_tokens >= 192 for o in outs1[1:]), \
        [o.num_cached_tokens for o in outs1]
    outs2 = _run(embed_on, "embed", again)
    assert all(o.num_cached_tokens >= 192 for o in outs2), [o.num_cached_tokens for o in outs2]
    assert all(o.num_cached_tokens == 192 for o in outs2)  # 12 full blocks of the prefix
    outs3 = _run(embed_on, "embed", first)                 # the very same prompts
    assert [o.num_cached_tokens for o in outs3] == [(len(p) - 1) // BLOCK * BLOCK
                                                    for p in first]
    ref = _run(off, "embed", first + again)
    for got, want in zip(outs1 + outs2, ref):
        _assert_same("embed", _vec("embed", got), _vec("embed", want), "hit vs no cache")
    for got, want in zip(outs3, ref):
        _assert_same("embed", _vec("embed", got), _vec("embed", want), "repeat vs no cache")


def test_reset_prefix_cache_forgets_every_prefix(qwen3_embed_dir):
    llm = LLM(qwen3_embed_dir, block_size=BLOCK)
    tok = Tokens("qwen3_embed_dir", seed=12)
    prompt = tok(100)
    first = _run(llm, "embed", [prompt])[0]
    assert _run(llm, "embed", [prompt])[0].num_cached_tokens == 96
    assert llm.reset_prefix_cache() is True
    again = _run(llm, "embed", [prompt])[0]
    assert again.num_cached_tokens == 0
    _assert_same("embed", _vec("embed", again), _vec("embed", first), "after reset")


def test_strict_prefix_of_a_cached_prompt_recomputes_its_last_token(embed_on, shared_llm,
                                                                   qwen3_embed_dir):
    tok = Tokens("qwen3_embed_dir", seed=12)
    long = tok(100)
    _run(embed_on, "embed", [long])
    probes = [long[:32], long[:16], long[:17], long[:48], long[:1]]
    outs = _run(embed_on, "embed", probes)
    assert [o.num_cached_tokens for o in outs] == [16, 0, 16, 32, 0]
    ref = _run(_off_llm(shared_llm, qwen3_embed_dir), "embed", probes)
    for p, got, want in zip(probes, outs, ref):
        _assert_same("embed", _vec("embed", got), _vec("embed", want), f"{len(p)} tokens")
        _assert_same("embed", _vec("embed", got), _reference(qwen3_embed_dir, "embed", p),
                     f"{len(p)} tokens vs transformers")


def test_different_second_block_shares_only_the_first(embed_on, shared_llm, qwen3_embed_dir):
    tok = Tokens("qwen3_embed_dir", seed=13)
    x, y, z, x2, tail = tok(16), tok(16), tok(16), tok(16), tok(10)
    a, b, c = x + y + tail, x + z + tail, x2 + y + tail
    outs = [_run(embed_on, "embed", [p])[0] for p in (a, b, c)]
    assert [o.num_cached_tokens for o in outs] == [0, 16, 0]
    ref = _run(_off_llm(shared_llm, qwen3_embed_dir), "embed", [a, b, c])
    for got, want in zip(outs, ref):
        _assert_same("embed", _vec("embed", got), _vec("embed", want), "collision?")
    # a, b and c differ, and so do their embeddings.
    vecs = [_vec("embed", o) for o in outs]
    assert mf.cosine(vecs[0], vecs[1]) < 0.999 and mf.cosine(vecs[0], vecs[2]) < 0.999


def test_cache_salt_isolates_prompts(embed_on):
    """vLLM prompts may carry a `cache_salt`: equal salts share cached blocks, different
    salts (or none) never do."""
    tok = Tokens("qwen3_embed_dir", seed=14)
    ids = tok(70)
    run = lambda p: embed_on.embed([p], use_tqdm=False)[0]  # noqa: E731
    assert run({"prompt_token_ids": ids, "cache_salt": "alice"}).num_cached_tokens == 0
    assert run({"prompt_token_ids": ids, "cache_salt": "bob"}).num_cached_tokens == 0
    assert run({"prompt_token_ids": ids}).num_cached_tokens == 0
    assert run({"prompt_token_ids": ids, "cache_salt": "alice"}).num_cached_tokens == 64
    assert run({"prompt_token_ids": ids}).num_cached_tokens == 64
    with pytest.raises(ValueError, match="cache_salt"):
        run({"prompt_token_ids": ids, "cache_salt": 7})
    # Text prompts carry it too.
    text = mf.text_of_length(embed_on.get_tokenizer(), 40, seed=3)
    assert run({"prompt": text, "cache_salt": "carol"}).num_cached_tokens == 0
    assert run({"prompt": text, "cache_salt": "dave"}).num_cached_tokens == 0
    assert run({"prompt": text, "cache_salt": "carol"}).num_cached_tokens >= 32


def test_counters_track_queries_and_hits(qwen3_cls_dir):
    llm = LLM(qwen3_cls_dir, block_size=BLOCK)
    tok = Tokens("qwen3_cls_dir", seed=15)
    p = tok(40)
    _run(llm, "classify", [p])
    s = llm.llm_engine.stats
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (40, 0)
    _run(llm, "classify", [p, p[:33]])
    s = llm.llm_engine.stats
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (40 + 40 + 33, 32 + 32)
    assert s.num_steps == 2 and s.num_split_requests == 0  # default budget: one step each
    assert s.num_requests_finished == 3 and s.computed_tokens == 40 + 8 + 1


# ------------------------------------------------------------------ pressure

PRESSURE_MAX_LEN = 320       # 20 blocks per max-length prompt
PRESSURE_BLOCKS = 40         # about two of the longest (300-token, 19-block) prompts


def _pressure_prompts() -> list[list[int]]:
    tok = Tokens("qwen3_cls_dir", seed=21)
    prefixes = [tok(200), tok(130), tok(64)]
    rng = random.Random(22)
    prompts = []
    for i in range(50):
        n = rng.choice([5, 20, 47, 64, 120, 180, 230, 270, 300])
        if i % 3 == 0:
            prompts.append(tok(n))
        else:
            pre = prefixes[i % len(prefixes)]
            prompts.append((pre + tok(max(0, n - len(pre)) + 3))[:n])
    assert max(map(len, prompts)) == 300
    return prompts


@pytest.fixture(scope="module")
def pressure_run(qwen3_cls_dir):
    """50 requests through a pool of 40 blocks, chunked: a 128-token budget with at most
    32 tokens per request lets four long prompts be half-computed at once (4 x 19 blocks
    > 40), so running requests must be preempted."""
    llm = LLM(qwen3_cls_dir, block_size=BLOCK, max_model_len=PRESSURE_MAX_LEN,
              num_gpu_blocks_override=PRESSURE_BLOCKS, max_num_batched_tokens=128,
              long_prefill_token_threshold=32)
    prompts = _pressure_prompts()
    outs = _run(llm, "classify", prompts)
    return llm, prompts, outs


def test_pressure_all_requests_finish_exactly(pressure_run, shared_llm, qwen3_cls_dir):
    llm, prompts, outs = pressure_run
    assert llm.llm_engine.vllm_config.cache_config.num_blocks == PRESSURE_BLOCKS
    assert len(outs) == 50 and all(o.finished for o in outs)
    ref = _run(_off_llm(shared_llm, qwen3_cls_dir), "classify", prompts)
    for p, got, want in zip(prompts, outs, ref):
        assert got.prompt_token_ids == p
        _assert_same("classify", _vec("classify", got), _vec("classify", want),
                     f"{len(p)} tokens under pressure")
        _assert_same("classify", _vec("classify", got),
                     _reference(qwen3_cls_dir, "classify", p), f"{len(p)} tokens vs HF")
    stats = llm.llm_engine.stats
    assert stats.num_evictions >= 1, stats
    assert stats.prefix_cache_hits > 0, stats
    assert stats.num_split_requests > 0, stats
    assert stats.num_running == 0 and stats.num_waiting == 0
    assert llm.llm_engine.kv.num_free_blocks == PRESSURE_BLOCKS  # every block came back


def test_pressure_preempts(pressure_run):
    """Issue 3: 'with blocks for about two of the longest prompts, 50 requests still all
    finish ... and the counters show at least one eviction and one preemption'."""
    llm, _, _ = pressure_run
    stats = llm.llm_engine.stats
    assert stats.num_preemptions >= 1, stats


def test_smallest_pool_still_finishes_exactly(shared_llm, qwen3_cls_dir):
    """A pool of exactly one max_model_len prompt, several batches in a row."""
    llm = LLM(qwen3_cls_dir, block_size=BLOCK, max_model_len=PRESSURE_MAX_LEN,
              num_gpu_blocks_override=PRESSURE_MAX_LEN // BLOCK, max_num_batched_tokens=48)
    prompts = _pressure_prompts()[:20]
    off = _off_llm(shared_llm, qwen3_cls_dir)
    for _ in range(2):
        outs = _run(llm, "classify", prompts)
        ref = _run(off, "classify", prompts)
        for got, want in zip(outs, ref):
            _assert_same("classify", _vec("classify", got), _vec("classify", want), "tiny pool")
    assert llm.llm_engine.stats.num_evictions >= 1


def test_pool_too_small_for_one_prompt_is_a_clear_error(qwen3_cls_dir):
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(qwen3_cls_dir, block_size=BLOCK, max_model_len=PRESSURE_MAX_LEN,
            num_gpu_blocks_override=PRESSURE_MAX_LEN // BLOCK - 1)


def test_cpu_pool_sizing(monkeypatch, qwen3_cls_dir):
    # Capped at what max_num_seqs x max_model_len needs.
    llm = LLM(qwen3_cls_dir, block_size=BLOCK, max_model_len=64, max_num_seqs=3)
    assert llm.llm_engine.vllm_config.cache_config.num_blocks == 3 * 64 // BLOCK
    # Bounded by VLLM_CPU_KVCACHE_SPACE (GiB): tiny Qwen3 = 2 layers x K,V x 16 slots x
    # 2 kv heads x 32 dims x 4 bytes = 16 KiB a block.
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", str(64 * 16 * 1024 / 2**30))
    llm = LLM(qwen3_cls_dir, block_size=BLOCK, max_model_len=512)
    assert llm.llm_engine.vllm_config.cache_config.num_blocks == 64
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", str(8 * 16 * 1024 / 2**30))
    with pytest.raises(ValueError, match="VLLM_CPU_KVCACHE_SPACE"):
        LLM(qwen3_cls_dir, block_size=BLOCK, max_model_len=512)
