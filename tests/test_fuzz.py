"""Fuzzing: the HTTP app against its own OpenAPI schema (schemathesis: no 5xx, the error
envelope on every 4xx), and a hypothesis state machine over the KV-cache manager and its
block pool (allocate, compute, hit, copy a cached partial block, evict, preempt, free:
reference counts, the free list, the hash maps and every cache hit's contents stay
consistent)."""
from __future__ import annotations

import types

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule)

from vllm.core.kv_cache_manager import KVCacheManager, hash_blocks, hash_runs
from vllm.core.request import Request
from vllm.entrypoints.openai.api_server import build_app


# ----- the HTTP app against its schema --------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_app(minilm_engine):
    return build_app(minilm_engine, types.SimpleNamespace(served_model_name=["minilm"]))


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_app):
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)


schema = schemathesis.pytest.from_fixture("fuzz_schema")


@schema.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_5xx_and_every_error_is_the_envelope(case, minilm_engine):
    response = case.call()
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == response.status_code and error["message"]
    assert minilm_engine.is_alive


# ----- KV-cache manager and block pool ----------------------------------------------------------
BLOCK = 4
NUM_BLOCKS = 12
# A tiny vocabulary and a few shared stems, so prompts share prefixes and hit the cache.
STEMS = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5, 5, 5, 5]]
prompts = st.builds(lambda stem, tail: STEMS[stem] + tail,
                    st.integers(0, len(STEMS) - 1),
                    st.lists(st.integers(1, 6), min_size=1, max_size=12))


class KVCacheMachine(RuleBasedStateMachine):
    """Drives `KVCacheManager` as the scheduler does; `content` models what each block's
    memory holds (the whole prefix up to its end), written when a request computes it."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCacheManager(NUM_BLOCKS, BLOCK, enable_caching=True)
        self.running: dict[str, Request] = {}
        self.content: dict[int, tuple[int, ...]] = {}
        self.next_id = 0

    @rule(tokens=prompts, chunk=st.integers(1, 16), prompt_len=st.integers(0, 12))
    def admit(self, tokens: list[int], chunk: int, prompt_len: int) -> None:
        """Admit a request whose first `prompt_len` tokens are a shared prompt (its
        partial last block gets cached); a cached partial run is copied, as the runner."""
        req = Request(f"r{self.next_id}", tokens, prompt_len=prompt_len)
        self.next_id += 1
        self.kv.prepare(req)
        hits, num_hit = self.kv.get_computed_blocks(req)
        for i, block in enumerate(hits):  # a hit holds exactly this prompt's prefix
            assert self.content.get(block.block_id) == tuple(tokens[:(i + 1) * BLOCK])
        partial = self.kv.find_partial(req, num_hit)
        source = None
        if partial is not None:  # its first slots hold exactly this prompt's next tokens
            end = num_hit + partial.num_tokens
            source = self.content.get(partial.block.block_id, ())[:end]
            assert source == tuple(tokens[:end])
            num_hit = end
        assert num_hit < req.num_tokens  # never the last token
        req.num_computed_tokens = num_hit
        n = min(chunk, req.num_tokens - num_hit)
        if self.kv.allocate_slots(req, n, hits):
            if partial is not None:  # the runner's copy, before the step writes anything
                copy = self.kv.copy_for(req, partial)
                assert copy.src == partial.block.block_id and copy.num_slots == len(source) % BLOCK
                self.content[copy.dst] = source
            self.running[req.request_id] = req
            self._compute(req, n)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), chunk=st.integers(1, 16))
    def step(self, data, chunk: int) -> None:
        req = data.draw(st.sampled_from(sorted(self.running.values(),
                                               key=lambda r: r.request_id)))
        n = min(chunk, req.num_remaining)
        if n == 0 or not self.kv.allocate_slots(req, n):
            return
        self._compute(req, n)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), preempt=st.booleans())
    def release(self, data, preempt: bool) -> None:
        """Finish (or preempt: blocks freed, progress lost) one running request."""
        rid = data.draw(st.sampled_from(sorted(self.running)))
        req = self.running.pop(rid)
        self.kv.free(req)
        if preempt:
            req.num_computed_tokens = 0

    @rule()
    def reset(self) -> None:
        self.kv.reset_prefix_cache()

    def _compute(self, req: Request, n: int) -> None:
        start = req.num_computed_tokens
        req.num_computed_tokens += n
        blocks = self.kv.req_blocks[req.request_id]
        for i in range(start // BLOCK, -(-req.num_computed_tokens // BLOCK)):
            end = min((i + 1) * BLOCK, req.num_computed_tokens)
            self.content[blocks[i].block_id] = tuple(req.prompt_token_ids[:end])
        self.kv.cache_partial(req)  # after the step wrote them, as Scheduler.update

    @invariant()
    def reference_counts_match_holders(self) -> None:
        held: dict[int, int] = {}
        for blocks in self.kv.req_blocks.values():
            for block in blocks:
                held[block.block_id] = held.get(block.block_id, 0) + 1
        pool = self.kv.pool
        for block in pool.blocks:
            assert block.ref_cnt == held.get(block.block_id, 0)
        assert {b.block_id for b in pool.blocks if b.ref_cnt == 0} == set(pool._free)
        assert set(self.kv.req_blocks) == set(self.running)

    @invariant()
    def hash_map_is_consistent(self) -> None:
        pool = self.kv.pool
        for block_hash, block in pool._cached.items():
            assert block.block_hash == block_hash
        hashed = [b for b in pool.blocks if b.block_hash is not None]
        assert len(hashed) == len(pool._cached)
        for req in self.running.values():
            for i, block in enumerate(self.kv.req_blocks[req.request_id]):
                assert block.block_hash in (None, *req.block_hashes[i:i + 1])
        for run_hash, block in pool._partial.items():
            assert run_hash in block.partial_hashes
        assert sum(len(b.partial_hashes) for b in pool.blocks) == len(pool._partial)

    @invariant()
    def partial_runs_hold_their_tokens(self) -> None:
        """Every cached partial run's block still holds a prompt whose hash chain gives
        that run's hash (its memory was not handed to another request)."""
        for run_hash, block in self.kv.pool._partial.items():
            held = self.content[block.block_id]
            start = (len(held) - 1) // BLOCK * BLOCK
            parent = hash_blocks(list(held[:start]), BLOCK)[-1:] or [b""]
            assert run_hash in hash_runs(parent[0], list(held[start:]))


TestKVCacheMachine = KVCacheMachine.TestCase
TestKVCacheMachine.settings = settings(max_examples=150, stateful_step_count=40,
                                       deadline=None, derandomize=True)
