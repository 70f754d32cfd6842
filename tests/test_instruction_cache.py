"""A prompt's partial last block is cached too (copy-on-write), so an instruction prefix
costs nothing even when it does not end on a block boundary.

* core: a request that knows its prompt's length registers every cut of the prompt's
  partial block once its step wrote it; a later request continuing those tokens gets a
  `BlockCopy` into a block of its own and starts after them; eviction and reset forget
  the runs; the last token is never covered.
* engine: embeddings with the copied prefix equal caching off (and Transformers), the
  cached-token counts include the partial run, and a pool small enough to evict keeps
  reference counts and run maps consistent.
"""
from __future__ import annotations

import numpy as np
import pytest

import model_factory as mf
from vllm import LLM
from vllm.config.scheduler import SchedulerConfig
from vllm.core.kv_cache_manager import KVCacheManager
from vllm.core.request import Request
from vllm.core.scheduler import Scheduler

BS = 4


def _sched(num_blocks: int = 32) -> Scheduler:
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8,
                          enable_chunked_prefill=True, long_prefill_token_threshold=0)
    cfg.finalize(64)
    return Scheduler(cfg, KVCacheManager(num_blocks, BS, True))


def _step(s: Scheduler, *reqs: Request):
    for r in reqs:
        s.add_request(r)
    out = s.schedule()
    s.update(out)
    return out.scheduled


PROMPT = [11, 12, 13, 14, 15, 16, 17]          # 7 tokens: one full block + 3


def test_reader_copies_the_prompts_partial_block():
    s = _sched()
    [w] = _step(s, Request("w", PROMPT + [20, 21], prompt_len=7))
    assert w.copy is None and w.num_computed == 0
    # The writer finished (its blocks are free) but its runs stay cached.
    [r] = _step(s, Request("r", PROMPT + [30, 31, 32], prompt_len=7))
    assert (r.num_computed, r.num_new) == (7, 3) and r.request.num_cached_tokens == 7
    assert r.copy is not None
    assert (r.copy.src, r.copy.num_slots) == (w.block_ids[1], 3)
    assert r.copy.dst == r.block_ids[1] and r.block_ids[0] == w.block_ids[0]
    assert (s.kv.prefix_cache_queries, s.kv.prefix_cache_hits) == (9 + 10, 7)


def test_a_shorter_common_run_hits_and_the_last_token_is_computed():
    s = _sched()
    _step(s, Request("w", PROMPT + [20], prompt_len=7))
    # A BPE merge changed the prompt's last token: the run up to it still hits.
    [r] = _step(s, Request("r", PROMPT[:6] + [99, 40], prompt_len=7))
    assert r.num_computed == 6 and r.copy.num_slots == 2
    # The prompt alone plus one token: never its last token.
    [t] = _step(s, Request("t", PROMPT[:6], prompt_len=6))
    assert t.num_computed == 5 and t.copy.num_slots == 1


def test_runs_are_cached_only_after_their_step_and_salted():
    s = _sched()
    w, r = Request("w", PROMPT + [20], prompt_len=7), Request("r", PROMPT + [30], prompt_len=7)
    scheduled = _step(s, w, r)  # same step: r cannot copy what w is writing now
    assert [x.copy for x in scheduled] == [None, None] and scheduled[1].num_computed == 4
    [salted] = _step(s, Request("x", PROMPT + [40], cache_salt="t1", prompt_len=7))
    assert salted.num_computed == 0 and salted.copy is None


def test_eviction_and_reset_forget_runs():
    s = _sched(num_blocks=4)
    [w] = _step(s, Request("w", PROMPT + [20], prompt_len=7))
    pool = s.kv.pool
    src = pool.blocks[w.block_ids[1]]
    assert len(src.partial_hashes) == 3 and len(pool._partial) == 3
    _step(s, Request("big", list(range(100, 116))))  # takes all 4 blocks: evicts
    assert src.partial_hashes == [] and pool._partial == {} and pool.num_evictions >= 2
    [r] = _step(s, Request("r", PROMPT + [30], prompt_len=7))
    assert r.copy is None
    s.kv.reset_prefix_cache()
    assert pool._partial == {} and all(not b.partial_hashes for b in pool.blocks)
    assert pool.num_free == 4 and all(b.ref_cnt == 0 for b in pool.blocks)


# ----- through the engine: exact numbers, real hits, eviction ---------------------------------
BLOCK = 16


def _instruction(llm: LLM) -> tuple[str, int]:
    """An instruction whose prompt length ends mid-block (past one full block)."""
    words = "Instruct: given a web search query retrieve relevant passages".split()
    proc = llm.llm_engine.processor
    while True:
        text = " ".join(words) + "\nQuery: "
        n = proc.prompt_len(["x"], prompt=text)
        if n > BLOCK and n % BLOCK >= 4:
            return text, n
        words.append("now")


QUERIES = ["cheap flights", "how tall is everest", "river nile length today",
           "python sort a list", "best pizza near me please", "weather"]


def _vectors(outs) -> np.ndarray:
    return np.array([o.outputs.embedding for o in outs])


def _common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_copied_prefix_gives_the_uncached_numbers(qwen3_embed_dir):
    on = LLM(qwen3_embed_dir, block_size=BLOCK)
    off = LLM(qwen3_embed_dir, block_size=BLOCK, enable_prefix_caching=False)
    instruction, n = _instruction(on)
    [warm] = on.embed(["warm up query"], prompt=instruction, use_tqdm=False)
    outs = on.embed(QUERIES, prompt=instruction, use_tqdm=False)
    ref = off.embed(QUERIES, prompt=instruction, use_tqdm=False)
    np.testing.assert_allclose(_vectors(outs), _vectors(ref), atol=1e-5)
    hf = mf.hf_embedding(qwen3_embed_dir, outs[1].prompt_token_ids, "LAST", normalize=True)
    assert mf.cosine(np.asarray(outs[1].outputs.embedding), hf) >= 0.9999
    for o in outs:  # full blocks and the partial run, as far as the tokens agree
        shared = min(_common(o.prompt_token_ids, warm.prompt_token_ids), n)
        assert o.num_cached_tokens == shared and shared > n // BLOCK * BLOCK
    assert all(o.num_cached_tokens == 0 for o in ref)


def test_eviction_keeps_counts_and_numbers(qwen3_embed_dir):
    # A pool of 8 blocks: each request needs 4, so sources of copies get evicted.
    on = LLM(qwen3_embed_dir, block_size=BLOCK, num_gpu_blocks_override=8,
             max_num_seqs=2, max_model_len=80)
    off = LLM(qwen3_embed_dir, block_size=BLOCK, enable_prefix_caching=False,
              max_model_len=80)
    instruction, n = _instruction(on)
    texts = [f"{q} {i}" for i in range(3) for q in QUERIES]
    got = [o for t in texts for o in on.embed([t], prompt=instruction, use_tqdm=False)]
    ref = off.embed(texts, prompt=instruction, use_tqdm=False)
    np.testing.assert_allclose(_vectors(got), _vectors(ref), atol=1e-5)
    assert any(o.num_cached_tokens % BLOCK for o in got)  # partial runs were copied
    pool = on.llm_engine.kv.pool
    assert on.llm_engine.stats.num_evictions > 0
    assert pool.num_free == len(pool.blocks) and all(b.ref_cnt == 0 for b in pool.blocks)
    assert sorted(pool._partial) == sorted(h for b in pool.blocks for h in b.partial_hashes)
    assert all(pool._partial[h] is b for b in pool.blocks for h in b.partial_hashes)
