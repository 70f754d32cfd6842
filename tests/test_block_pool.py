"""Block pool, KV cache manager and scheduler on their own: no model, no tensors.

`core/` owns block ids, reference counts and hashes; these tests drive it with plain
`Request`s and check the bookkeeping contracts of DESIGN.md (hash chain, LRU free list,
revival, sharing, never covering the last token) and of the scheduler (token budget,
sequence cap, chunking, preemption, abort).
"""
from __future__ import annotations

import random

import pytest

from vllm.config.scheduler import SchedulerConfig
from vllm.core.block_pool import BlockPool
from vllm.core.kv_cache_manager import KVCacheManager, hash_blocks
from vllm.core.request import Request, RequestStatus
from vllm.core.scheduler import Scheduler

BS = 4


def _req(rid: str, ids, salt=None) -> Request:
    return Request(rid, list(ids), cache_salt=salt)


def _toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


# ------------------------------------------------------------------ hash chain

def test_hash_chain_equal_prefixes_equal_hashes():
    a = hash_blocks(_toks(18), BS)
    b = hash_blocks(_toks(12) + [99, 98, 97, 96, 95], BS)
    assert len(a) == 4 and len(b) == 4  # only full blocks are hashed
    assert a[:3] == b[:3]
    assert a[3] != b[3]
    assert len(set(a)) == 4  # every position has its own hash
    assert hash_blocks(_toks(3), BS) == []
    assert hash_blocks(_toks(8), BS) == a[:2]


def test_hash_chain_change_in_block0_changes_every_later_hash():
    base = _toks(16)
    changed = [1000] + base[1:]
    a, b = hash_blocks(base, BS), hash_blocks(changed, BS)
    assert all(x != y for x, y in zip(a, b))
    # The same block content behind a different parent hashes differently.
    assert hash_blocks(_toks(4, 4), BS)[0] != a[1]


def test_hash_chain_extra_key_changes_hashes():
    ids = _toks(12)
    plain = hash_blocks(ids, BS)
    salted = hash_blocks(ids, BS, extra="alice")
    assert all(x != y for x, y in zip(plain, salted))
    assert hash_blocks(ids, BS, extra="alice") == salted
    assert all(x != y for x, y in zip(salted, hash_blocks(ids, BS, extra="bob")))


def test_hash_depends_on_token_values_not_only_count():
    assert hash_blocks([1, 2, 3, 4], BS) != hash_blocks([4, 3, 2, 1], BS)
    assert hash_blocks([2**40, 0, 0, 0], BS) != hash_blocks([0, 0, 0, 0], BS)


# ------------------------------------------------------------------ block pool

def test_pool_allocate_and_free_lru_order():
    pool = BlockPool(4)
    assert pool.num_free == 4
    blocks = pool.allocate(4)
    assert [b.block_id for b in blocks] == [0, 1, 2, 3]
    assert all(b.ref_cnt == 1 for b in blocks)
    assert pool.num_free == 0
    pool.free([blocks[2], blocks[0]])
    pool.free([blocks[3]])
    assert pool.num_free == 3
    # Least recently freed first.
    assert [b.block_id for b in pool.allocate(3)] == [2, 0, 3]


def test_pool_allocate_raises_when_short():
    pool = BlockPool(3)
    pool.allocate(2)
    with pytest.raises(RuntimeError):
        pool.allocate(2)
    assert pool.num_free == 1  # nothing was taken by the failed call


def test_pool_eviction_is_lru_and_counted():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    for i, b in enumerate(blocks):
        pool.cache(b, bytes([i]) * 32)
    pool.free([blocks[1], blocks[2], blocks[0]])
    assert pool.num_evictions == 0
    assert all(pool.lookup(bytes([i]) * 32) is blocks[i] for i in range(3))  # kept while free
    (got,) = pool.allocate(1)
    assert got is blocks[1]
    assert got.block_hash is None and got.ref_cnt == 1
    assert pool.lookup(bytes([1]) * 32) is None
    assert pool.num_evictions == 1
    pool.allocate(2)
    assert pool.num_evictions == 3
    assert pool.lookup(bytes([0]) * 32) is None and pool.lookup(bytes([2]) * 32) is None


def test_pool_allocating_unhashed_blocks_is_not_an_eviction():
    pool = BlockPool(2)
    b = pool.allocate(2)
    pool.free(b)
    pool.allocate(2)
    assert pool.num_evictions == 0


def test_pool_revival_via_lookup_and_touch():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    h = b"h" * 32
    pool.cache(blocks[0], h)
    pool.free(blocks)
    assert pool.num_free == 3
    hit = pool.lookup(h)
    assert hit is blocks[0] and hit.ref_cnt == 0
    pool.touch([hit])
    assert hit.ref_cnt == 1
    assert pool.num_free == 2
    # The revived block is out of the free list: never handed out again while held.
    others = pool.allocate(2)
    assert hit not in others
    assert pool.lookup(h) is hit
    with pytest.raises(RuntimeError):
        pool.allocate(1)
    # A second holder takes another reference; freeing needs both.
    pool.touch([hit])
    assert hit.ref_cnt == 2
    pool.free([hit])
    assert hit.ref_cnt == 1 and pool.num_free == 0
    pool.free([hit])
    assert hit.ref_cnt == 0 and pool.num_free == 1
    assert pool.lookup(h) is hit


def test_pool_cache_keeps_first_block_for_a_hash():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    h = b"x" * 32
    pool.cache(a, h)
    pool.cache(b, h)
    assert pool.lookup(h) is a
    assert b.block_hash is None
    pool.cache(a, b"y" * 32)  # a hashed block keeps its hash
    assert a.block_hash == h and pool.lookup(b"y" * 32) is None


def test_pool_reset_hashes():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    for i, b in enumerate(blocks):
        pool.cache(b, bytes([i]) * 32)
    pool.free(blocks[:2])
    pool.reset_hashes()
    assert all(pool.lookup(bytes([i]) * 32) is None for i in range(3))
    assert all(b.block_hash is None for b in blocks)
    assert pool.num_free == 2 and blocks[2].ref_cnt == 1  # ref counts untouched
    pool.allocate(2)
    assert pool.num_evictions == 0


# ------------------------------------------------------------------ KV cache manager

def _kv(num_blocks: int = 16, caching: bool = True) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, caching)


def _admit(kv: KVCacheManager, req: Request, n=None) -> int:
    """Do what the scheduler does for a waiting request; returns the hit tokens."""
    kv.prepare(req)
    hits, num_hit = kv.get_computed_blocks(req)
    n = req.num_tokens - num_hit if n is None else n
    req.num_computed_tokens = num_hit
    assert kv.allocate_slots(req, n, hits)
    req.num_computed_tokens = num_hit + n
    return num_hit


def test_kv_prepare_hashes_full_blocks_only():
    kv = _kv()
    r = _req("a", _toks(10))
    kv.prepare(r)
    assert r.block_hashes == hash_blocks(_toks(10), BS)
    assert len(r.block_hashes) == 2
    off = _kv(caching=False)
    r2 = _req("b", _toks(10))
    off.prepare(r2)
    assert r2.block_hashes == []


@pytest.mark.parametrize("n,expected", [(4, 0), (5, 4), (8, 4), (9, 8), (12, 8), (13, 12)])
def test_kv_hit_never_covers_last_token(n, expected):
    kv = _kv()
    _admit(kv, _req("full", _toks(16)))
    kv.free(_req("full", []))
    r = _req("probe", _toks(n))
    kv.prepare(r)
    blocks, num_hit = kv.get_computed_blocks(r)
    assert num_hit == expected
    assert len(blocks) * BS == num_hit
    assert num_hit < n


def test_kv_hits_stop_at_first_miss():
    kv = _kv()
    _admit(kv, _req("a", _toks(16)))
    ids = _toks(4) + [500, 501, 502, 503] + _toks(8, 8) + [1]
    r = _req("b", ids)
    kv.prepare(r)
    blocks, num_hit = kv.get_computed_blocks(r)
    assert num_hit == 4  # blocks 2 and 3 are equal content, but behind a different parent


def test_kv_caching_disabled_never_hits():
    kv = _kv(caching=False)
    _admit(kv, _req("a", _toks(16)))
    r = _req("b", _toks(16))
    kv.prepare(r)
    assert kv.get_computed_blocks(r) == ([], 0)
    kv.record_lookup(16, 0)
    assert kv.prefix_cache_queries == 0


def test_kv_salt_isolates_requests():
    kv = _kv()
    _admit(kv, _req("a", _toks(17), salt="alice"))
    assert _admit(kv, _req("b", _toks(17), salt="bob")) == 0
    assert _admit(kv, _req("c", _toks(17))) == 0
    assert _admit(kv, _req("d", _toks(17), salt="alice")) == 16


def test_kv_two_requests_share_blocks_with_ref_counts():
    kv = _kv(num_blocks=8)
    a = _req("a", _toks(13))
    assert _admit(kv, a) == 0
    a_blocks = list(kv.req_blocks["a"])
    assert len(a_blocks) == 4 and kv.num_free_blocks == 4
    b = _req("b", _toks(12) + [77, 78])
    assert _admit(kv, b) == 12
    b_blocks = kv.req_blocks["b"]
    assert b_blocks[:3] == a_blocks[:3]
    assert [blk.ref_cnt for blk in a_blocks] == [2, 2, 2, 1]
    assert kv.num_free_blocks == 3  # b needed only one new block
    kv.free(a)
    assert [blk.ref_cnt for blk in a_blocks] == [1, 1, 1, 0]
    assert kv.num_free_blocks == 4
    kv.free(b)
    assert all(blk.ref_cnt == 0 for blk in a_blocks + b_blocks)
    assert kv.num_free_blocks == 8
    assert "a" not in kv.req_blocks and "b" not in kv.req_blocks


def test_kv_free_is_tail_first_so_prefix_outlives_tail():
    kv = _kv(num_blocks=4)
    a = _req("a", _toks(16))
    _admit(kv, a)
    hashes = list(a.block_hashes)
    kv.free(a)
    kv.pool.allocate(1)  # evicts the LRU block: a's last one
    assert kv.pool.lookup(hashes[3]) is None
    assert all(kv.pool.lookup(h) is not None for h in hashes[:3])
    kv.pool.allocate(1)
    assert kv.pool.lookup(hashes[2]) is None
    assert kv.pool.lookup(hashes[0]) is not None
    # The surviving prefix is still a hit.
    r = _req("b", _toks(9))
    kv.prepare(r)
    assert kv.get_computed_blocks(r)[1] == 8


def test_kv_revival_of_freed_blocks_through_a_hit():
    kv = _kv(num_blocks=5)
    a = _req("a", _toks(16))
    _admit(kv, a)
    kv.free(a)
    assert kv.num_free_blocks == 5
    b = _req("b", _toks(16) + [9])
    assert _admit(kv, b) == 16
    held = kv.req_blocks["b"]
    assert len(held) == 5 and all(blk.ref_cnt == 1 for blk in held)
    assert kv.num_free_blocks == 0
    assert kv.pool.num_evictions == 0
    assert kv.prefix_cache_hits == 0  # record_lookup is the scheduler's call
    kv.record_lookup(17, 16)
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (17, 16)


def test_kv_allocate_slots_failure_changes_nothing():
    kv = _kv(num_blocks=6)
    a = _req("a", _toks(16))
    _admit(kv, a)
    kv.free(a)  # 4 hashed blocks in the free list, 2 clean ones
    hog = _req("hog", [900] * 4)
    _admit(kv, hog)  # takes one clean block
    assert kv.num_free_blocks == 5
    b = _req("b", _toks(16) + list(range(100, 120)))  # 36 tokens = 9 blocks, 4 of them hits
    kv.prepare(b)
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 16
    b.num_computed_tokens = num_hit
    snapshot = ([blk.ref_cnt for blk in kv.pool.blocks], kv.num_free_blocks,
                dict(kv.req_blocks), kv.pool.num_evictions)
    # 5 new blocks needed, but reviving 4 free hits leaves only 1: refused.
    assert kv.allocate_slots(b, 20, hits) is False
    assert ([blk.ref_cnt for blk in kv.pool.blocks], kv.num_free_blocks,
            dict(kv.req_blocks), kv.pool.num_evictions) == snapshot
    assert "b" not in kv.req_blocks
    assert all(kv.pool.lookup(h) is not None for h in b.block_hashes[:4])
    # A request that fits uses the last free block.
    assert kv.allocate_slots(b, 4, hits) is True
    assert kv.num_free_blocks == 0


def test_kv_allocate_slots_grows_a_partial_request():
    kv = _kv(num_blocks=8)
    r = _req("r", _toks(30))
    kv.prepare(r)
    assert kv.allocate_slots(r, 6)
    assert len(kv.req_blocks["r"]) == 2
    assert kv.pool.lookup(r.block_hashes[0]) is not None   # full after this step
    assert kv.pool.lookup(r.block_hashes[1]) is None       # only 2 of 4 slots
    r.num_computed_tokens = 6
    assert kv.allocate_slots(r, 10)
    assert len(kv.req_blocks["r"]) == 4
    assert all(kv.pool.lookup(h) is not None for h in r.block_hashes[:4])
    assert kv.block_ids(r) == [b.block_id for b in kv.req_blocks["r"]]
    assert len(set(kv.block_ids(r))) == 4


# ------------------------------------------------------------------ scheduler

def _sched(num_blocks=64, budget=32, max_seqs=128, chunked=True, max_model_len=64,
           caching=True, block_size=BS, cap=0):
    """cap=0: no per-request chunk cap, so one request may take the whole budget."""
    cfg = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs,
                          enable_chunked_prefill=chunked, long_prefill_token_threshold=cap)
    cfg.finalize(max_model_len)
    return Scheduler(cfg, KVCacheManager(num_blocks, block_size, caching))


def _run(s: Scheduler, max_steps: int = 10_000, on_step=None) -> list[Request]:
    finished = []
    steps = 0
    while s.has_unfinished():
        out = s.schedule()
        if on_step is not None:
            on_step(s, out)
        finished += s.update(out)
        steps += 1
        assert steps < max_steps, "scheduler made no progress (deadlock?)"
    return finished


def test_scheduler_respects_budget_and_seq_cap():
    s = _sched(budget=20, max_seqs=3, max_model_len=64)
    rng = random.Random(1)
    reqs = [_req(str(i), [rng.randrange(1000) for _ in range(rng.randrange(1, 40))])
            for i in range(25)]
    for r in reqs:
        s.add_request(r)
    seen = []

    def check(sched, out):
        assert out.num_tokens <= 20
        assert len(out.scheduled) <= 3
        assert len(sched.running) <= 3
        assert len({x.request.request_id for x in out.scheduled}) == len(out.scheduled)
        assert all(x.num_new > 0 for x in out.scheduled)
        seen.append(out.num_tokens)

    done = _run(s, on_step=check)
    assert sorted(r.request_id for r in done) == sorted(r.request_id for r in reqs)
    assert max(seen) == 20  # the budget is used, not just respected
    assert all(r.status is RequestStatus.FINISHED for r in reqs)
    assert all(r.num_computed_tokens == r.num_tokens for r in reqs)
    assert s.kv.num_free_blocks == 64


def test_scheduler_max_num_seqs_one():
    s = _sched(budget=64, max_seqs=1)
    for i in range(4):
        s.add_request(_req(str(i), _toks(5, 100 * i)))
    order = []
    _run(s, on_step=lambda sched, out: order.append([x.request.request_id
                                                     for x in out.scheduled]))
    assert order == [["0"], ["1"], ["2"], ["3"]]


def test_chunked_prefill_splits_a_long_prompt():
    s = _sched(budget=32, max_model_len=128)
    r = _req("long", _toks(100))
    s.add_request(r)
    steps = []
    _run(s, on_step=lambda sched, out: steps.append(
        [(x.num_computed, x.num_new, x.finishes) for x in out.scheduled]))
    assert steps == [[(0, 32, False)], [(32, 32, False)], [(64, 32, False)], [(96, 4, True)]]
    assert r.num_steps == 4 and r.status is RequestStatus.FINISHED


def test_long_prompt_interleaves_with_short_ones_under_the_default_cap():
    """By default (chunked prefill) one request takes at most half the budget per step,
    so a short request arriving behind a long one runs in the first step."""
    s = _sched(budget=32, max_model_len=128, cap=None)
    assert s.config.long_prefill_token_threshold == 16
    long, short = _req("long", _toks(100)), _req("short", _toks(5, 500))
    s.add_request(long)
    s.add_request(short)
    first = s.schedule()
    assert [(x.request.request_id, x.num_new) for x in first.scheduled] == \
        [("long", 16), ("short", 5)]
    assert [r.request_id for r in s.update(first)] == ["short"]
    finished = _run(s)
    assert [r.request_id for r in finished] == ["long"] and long.num_steps == 7


def test_chunked_prefill_fills_leftover_budget_with_waiting_requests():
    s = _sched(budget=32, max_model_len=128)
    long, short = _req("long", _toks(40)), _req("short", _toks(5, 500))
    s.add_request(long)
    s.add_request(short)
    first = s.schedule()
    assert [(x.request.request_id, x.num_new) for x in first.scheduled] == [("long", 32)]
    s.update(first)
    second = s.schedule()
    assert [(x.request.request_id, x.num_new) for x in second.scheduled] == \
        [("long", 8), ("short", 5)]
    assert [r.request_id for r in s.update(second)] == ["long", "short"]


def test_block_tables_cover_exactly_the_computed_tokens():
    s = _sched(budget=13, max_model_len=64)
    reqs = [_req(str(i), _toks(n, 50 * i)) for i, n in enumerate([30, 7, 19, 4, 25])]
    for r in reqs:
        s.add_request(r)

    def check(sched, out):
        ids_in_step = []
        for x in out.scheduled:
            total = x.num_computed + x.num_new
            assert len(x.block_ids) == -(-total // BS)
            ids_in_step.append(set(x.block_ids))
        # No block is held by two requests unless shared through the cache (equal hashes).
        for i, a in enumerate(ids_in_step):
            for b in ids_in_step[i + 1:]:
                assert not (a & b)

    _run(s, on_step=check)


def test_chunking_off_schedules_whole_prompts_only():
    s = _sched(budget=64, chunked=False, max_model_len=64)
    reqs = [_req(str(i), _toks(n, 100 * i)) for i, n in enumerate([40, 40, 10, 64, 1])]
    for r in reqs:
        s.add_request(r)
    steps = []

    def check(sched, out):
        for x in out.scheduled:
            assert x.finishes, "a partial prompt was scheduled with chunking off"
        assert out.num_tokens <= 64
        steps.append([x.request.request_id for x in out.scheduled])

    _run(s, on_step=check)
    assert steps[0] == ["0"]  # "1" (40) does not fit beside "0"; FCFS, so nothing jumps it
    assert all(r.num_steps == 1 for r in reqs)


def test_chunking_off_with_cache_hit_schedules_the_rest_whole():
    s = _sched(budget=16, chunked=False, max_model_len=16)
    a = _req("a", _toks(16))
    s.add_request(a)
    _run(s)
    b = _req("b", _toks(12) + [99, 98, 97, 96])
    s.add_request(b)
    out = s.schedule()
    assert [(x.num_computed, x.num_new) for x in out.scheduled] == [(12, 4)]
    assert b.num_cached_tokens == 12
    s.update(out)
    assert b.status is RequestStatus.FINISHED


def test_scheduler_prefix_hit_in_same_step_and_counters():
    s = _sched(budget=64, max_model_len=64)
    a, b = _req("a", _toks(20)), _req("b", _toks(16) + [7, 7, 7])
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    # b is admitted after a in the same step and shares a's first 4 blocks, which a
    # writes in this very step (attention writes every new K/V before any read).
    assert [(x.request.request_id, x.num_computed, x.num_new) for x in out.scheduled] == \
        [("a", 0, 20), ("b", 16, 3)]
    assert out.scheduled[1].block_ids[:4] == out.scheduled[0].block_ids[:4]
    assert (b.num_cached_tokens, a.num_cached_tokens) == (16, 0)
    assert (s.kv.prefix_cache_queries, s.kv.prefix_cache_hits) == (39, 16)
    s.update(out)
    assert s.kv.num_free_blocks == 64


def test_waiting_requests_wait_when_blocks_run_out():
    s = _sched(num_blocks=6, budget=64, max_model_len=24, caching=False)
    a, b = _req("a", _toks(24)), _req("b", _toks(24, 100))
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    assert [x.request.request_id for x in out.scheduled] == ["a"]
    assert b.status is RequestStatus.WAITING and b.num_computed_tokens == 0
    s.update(out)
    out = s.schedule()
    assert [x.request.request_id for x in out.scheduled] == ["b"]
    s.update(out)
    assert s.num_preemptions == 0 and not s.has_unfinished()


def _force_running(s: Scheduler, req: Request, n: int) -> None:
    """Put `req` in the running set with `n` tokens computed, as after an earlier step."""
    s.kv.prepare(req)
    assert s.kv.allocate_slots(req, n)
    req.num_computed_tokens = n
    req.num_steps = 1
    req.status = RequestStatus.RUNNING
    s.running.append(req)


def test_preemption_when_blocks_run_out_then_everything_finishes():
    """Two partially computed requests hold blocks; the first needs more than are free.
    The last running one is preempted (blocks freed, progress reset) and recomputed later."""
    s = _sched(num_blocks=6, budget=100, max_model_len=24)
    a, b = _req("a", _toks(24)), _req("b", _toks(24, 100))
    _force_running(s, a, 8)
    _force_running(s, b, 8)
    late = _req("late", _toks(3, 300))
    s.add_request(late)
    assert s.kv.num_free_blocks == 2
    out = s.schedule()
    assert s.num_preemptions == 1 and b.num_preemptions == 1
    assert b.status is RequestStatus.WAITING and b.num_computed_tokens == 0
    assert "b" not in s.kv.req_blocks
    assert list(s.waiting)[0] is b  # back at the head of the queue
    assert [(x.request.request_id, x.num_computed, x.num_new) for x in out.scheduled] == \
        [("a", 8, 16)]  # no admissions in a step that preempted
    finished = s.update(out)
    assert finished == [a]
    rest = _run(s)
    assert {r.request_id for r in rest} == {"b", "late"}
    assert b.num_computed_tokens == 24 and b.status is RequestStatus.FINISHED
    assert s.kv.num_free_blocks == 6
    assert all(blk.ref_cnt == 0 for blk in s.kv.pool.blocks)


def test_preempted_request_may_revive_its_own_blocks():
    """Freed tail first, a preempted request's prefix blocks are the last to be evicted,
    so its restart can revive them."""
    s = _sched(num_blocks=10, budget=100, max_model_len=32)
    a, b = _req("a", _toks(32)), _req("b", _toks(24, 100))
    _force_running(s, a, 8)     # 2 blocks
    _force_running(s, b, 16)    # 4 blocks, all full and hashed
    out = s.schedule()          # a needs 6 more blocks, 4 free: b is preempted
    assert s.num_preemptions == 1
    assert [(x.request.request_id, x.num_new) for x in out.scheduled] == [("a", 24)]
    s.update(out)
    out = s.schedule()
    (x,) = out.scheduled
    assert x.request is b
    # a took the 4 clean blocks, then b's two tail blocks; b's first two survived.
    assert x.num_computed == 8
    assert b.num_cached_tokens == 0  # the output reports the first scheduling's hit
    s.update(out)
    assert not s.has_unfinished()


def test_a_running_request_alone_that_cannot_grow_preempts_itself_without_deadlock():
    s = _sched(num_blocks=6, budget=100, max_model_len=24)
    a = _req("a", _toks(24))
    _force_running(s, a, 8)
    hog = _req("hog", [5] * 12)
    s.kv.prepare(hog)
    assert s.kv.allocate_slots(hog, 12)  # blocks held outside the scheduler
    out = s.schedule()
    assert out.scheduled == [] and a.num_preemptions == 1
    s.kv.free(hog)
    assert [r.request_id for r in _run(s)] == ["a"]


def test_abort_frees_blocks_wherever_the_request_is():
    s = _sched(num_blocks=32, budget=10, max_model_len=64)
    reqs = [_req(str(i), _toks(30, 100 * i)) for i in range(3)]
    for r in reqs:
        s.add_request(r)
    s.update(s.schedule())
    assert reqs[0].status is RequestStatus.RUNNING
    assert s.kv.num_free_blocks < 32
    found = s.abort({"0", "2", "nope"})
    assert {r.request_id for r in found} == {"0", "2"}
    assert reqs[0].status is RequestStatus.ABORTED and reqs[2].status is RequestStatus.ABORTED
    assert reqs[0].is_finished
    assert s.kv.num_free_blocks == 32
    assert [r.request_id for r in _run(s)] == ["1"]
    assert s.kv.num_free_blocks == 32


@pytest.mark.parametrize("seed", range(6))
def test_random_workloads_always_finish(seed):
    """Random geometry and prompts (some sharing prefixes): every request finishes, every
    step respects the budget, chunking off never splits, and every block comes back."""
    rng = random.Random(seed)
    bs = rng.choice([2, 4, 16])
    max_model_len = rng.choice([16, 48, 100])
    min_blocks = -(-max_model_len // bs)
    chunked = rng.random() < 0.6
    budget = rng.choice([1, 5, 16, 64]) if chunked else max_model_len + rng.randrange(50)
    s = _sched(num_blocks=min_blocks + rng.randrange(0, 2 * min_blocks), budget=budget,
               max_seqs=rng.choice([1, 3, 128]), chunked=chunked,
               max_model_len=max_model_len, caching=rng.random() < 0.8, block_size=bs)
    shared = [rng.randrange(50) for _ in range(max_model_len)]
    reqs = []
    for i in range(40):
        n = rng.randrange(1, max_model_len + 1)
        ids = shared[:n] if rng.random() < 0.5 else [rng.randrange(50) for _ in range(n)]
        reqs.append(_req(str(i), ids))
        s.add_request(reqs[-1])

    def check(sched, out):
        assert out.num_tokens <= budget
        for x in out.scheduled:
            assert x.num_computed == x.request.num_computed_tokens
            assert x.num_computed < x.request.num_tokens
            if not chunked:
                assert x.finishes
        # Held blocks never exceed the pool, and ref counts match the holders.
        holders = {}
        for blocks in sched.kv.req_blocks.values():
            for blk in blocks:
                holders[blk.block_id] = holders.get(blk.block_id, 0) + 1
        for blk in sched.kv.pool.blocks:
            assert blk.ref_cnt == holders.get(blk.block_id, 0)

    done = _run(s, on_step=check)
    assert len(done) == 40
    assert all(r.num_computed_tokens == r.num_tokens for r in reqs)
    assert all(r.num_cached_tokens < r.num_tokens for r in reqs)
    assert s.kv.num_free_blocks == len(s.kv.pool.blocks)
