"""The prefix-aware router on its own: affinity, load slack, bounds, dead replicas."""
from __future__ import annotations

from vllm.scaleout.router import PrefixRouter


def _prompt(prefix: int, n: int, tail: int = 0) -> list[int]:
    return [prefix * 1000 + i for i in range(n)] + [7] * tail


def test_shared_prefix_goes_to_its_owner_unless_overloaded():
    r = PrefixRouter(3, 16, slack=4)
    first = r.route(_prompt(1, 70), [0, 5, 5], [True] * 3)
    assert first == 0
    # later prompts with the same 64 leading tokens follow it, even when another is idler
    assert r.route(_prompt(1, 70) + [1, 2], [2, 0, 0], [True] * 3) == 0
    assert r.prefix_routed == 1
    # ... but not when the owner is busier than the least-loaded by more than the slack
    assert r.route(_prompt(1, 70), [9, 0, 1], [True] * 3) == 1
    # a prompt shorter than one block has nothing to match: least-loaded
    assert r.route([1, 2, 3], [3, 1, 2], [True] * 3) == 1


def test_dead_owner_and_forget():
    r = PrefixRouter(2, 16)
    owner = r.route(_prompt(2, 40), [0, 1], [True, True])
    assert owner == 0
    assert r.route(_prompt(2, 40), [0, 0], [False, True]) == 1
    r.forget(1)
    assert r.route(_prompt(2, 40), [0, 0], [True, True]) in (0, 1)


def test_table_is_bounded_and_depths_are_geometric():
    r = PrefixRouter(2, 16, capacity=64, max_blocks=32)
    assert r.depths(16 * 40) == [1, 2, 4, 8, 16, 32]
    assert r.depths(16 * 5 + 3) == [1, 2, 4, 5]
    assert r.depths(15) == []
    for p in range(500):
        r.route(_prompt(p, 600), [0, 0], [True, True])
        assert len(r) <= 64
    assert r.block_hashes(_prompt(3, 40)) == r.block_hashes(_prompt(3, 40) + [9])
    assert r.block_hashes(_prompt(3, 40), salt="a") != r.block_hashes(_prompt(3, 40))


ALL_UP = [True] * 3


def test_the_deepest_owner_wins_unless_beyond_slack():
    """Two replicas own prefixes of different depths of one family: replica 1 the first
    block (from a prompt that branched after it), replica 0 the first four blocks. A prompt
    sharing all four goes to the deepest owner, 0, not to the shallow one."""
    r = PrefixRouter(3, 16, slack=4)
    deep = _prompt(5, 64) + [1] * 16            # blocks 1-4 of the family, then its own
    assert r.route(deep, [0, 1, 1], ALL_UP) == 0
    branch = _prompt(5, 16) + [2] * 64          # same first block, then another branch
    assert r.route(branch, [9, 0, 1], ALL_UP) == 1  # owner 0 beyond slack: least-loaded
    assert r.route(branch, [0, 1, 0], ALL_UP) == 1  # now 1 owns the first block too
    assert r.route(deep + [3], [0, 3, 0], ALL_UP) == 0   # deepest (4 blocks) beats 1 block
    assert r.route(deep + [4], [0, 0, 0], ALL_UP) == 0
    # beyond the slack the deepest owner loses too, to the least-loaded
    assert r.route(deep + [5], [5, 2, 0], ALL_UP) == 2


def test_slack_is_inclusive_and_a_dead_deep_owner_is_skipped():
    r = PrefixRouter(2, 16, slack=4)
    family = _prompt(6, 48)
    assert r.route(family, [0, 0], [True, True]) == 0
    assert r.route(family, [4, 0], [True, True]) == 0     # exactly slack busier: still it
    assert r.route(family, [5, 0], [True, True]) == 1     # one more: the least-loaded
    assert r.route(family, [0, 9], [True, False]) == 0    # the new owner 1 is down
    assert r.route(family, [0, 0], [True, True]) == 0     # ... and 0 took the family back


def test_ties_rotate_and_dead_replicas_are_never_chosen():
    r = PrefixRouter(3, 16)
    assert sorted(r.route(None, [0, 0, 0], ALL_UP) for _ in range(3)) == [0, 1, 2]
    assert {r.route(None, [0, 0, 0], [True, False, True]) for _ in range(6)} == {0, 2}
    assert r.route([1] * 40, [3, 1, 2], ALL_UP) == 1      # least load beats rotation
    try:
        r.route(None, [0, 0, 0], [False] * 3)
        raise AssertionError("no live replica must raise LookupError")
    except LookupError:
        pass


def test_prefix_blind_modes_route_by_load_alone():
    for r, ids in ((PrefixRouter(2, 16, prefix_aware=False), _prompt(7, 64)),
                   (PrefixRouter(2, 16), None)):
        assert r.route(ids, [0, 1], [True, True]) == 0
        assert r.route(ids, [2, 1], [True, True]) == 1    # no affinity to the first pick
        assert r.prefix_routed == 0 and len(r) == 0


def test_a_family_in_use_survives_generations_and_forget_is_per_replica():
    r = PrefixRouter(2, 16, capacity=32, slack=4)
    hot, other = _prompt(8, 64), _prompt(9, 64)
    assert r.route(hot, [0, 0], [True, True]) == 0
    assert r.route(other, [5, 0], [True, True]) == 1
    for p in range(40):  # cold prompts roll the young generation over many times
        r.route(_prompt(100 + p, 32), [0, 0], [True, True])
        if p % 3 == 0:       # just before and just after a roll-over: found in either table
            assert r.route(hot, [2, 0], [True, True]) == 0
            assert r.route(other, [0, 2], [True, True]) == 1
    r.forget(1)
    assert r.route(hot, [2, 0], [True, True]) == 0        # 0's families kept
    assert r.route(other, [0, 2], [True, True]) == 0      # 1's forgotten: least-loaded


def test_max_blocks_caps_the_family_and_salt_splits_it():
    r = PrefixRouter(2, 16, max_blocks=2, slack=4)
    assert r.route(_prompt(10, 32) + [1] * 64, [0, 0], [True, True]) == 0
    assert r.route(_prompt(10, 32) + [2] * 64, [2, 0], [True, True]) == 0  # same 2 blocks
    assert r.route(_prompt(10, 32), [2, 0], [True, True], salt="tenant") == 1
