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
