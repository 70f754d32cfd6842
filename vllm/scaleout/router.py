"""Prefix-aware routing: a prompt goes to the replica that cached its leading blocks.

The router keeps its own view of which replica computed which prompt prefixes: the chained
hashes of a prompt's leading full blocks (the engine's block size), each mapped to the last
replica it was sent to. A new prompt walks its block hashes; the deepest hit names the
replica that most likely still holds those blocks in its prefix cache. Without a hit, or
when that replica is busier than the least-loaded one by more than `slack` requests, the
least-loaded replica takes it (ties rotate).

Bounds: only the first `max_blocks` blocks of a prompt are looked at (prefixes that agree
that far are one family), and only at geometric depths (1, 2, 4, 8, ... blocks, and the
prompt's last full block), so a request costs O(log max_blocks) table operations and one
pass over at most max_blocks * block_size token ids. The table holds at most `capacity`
entries in two generations of plain dicts: new entries go to the young one; when it is half
full it becomes the old one and the previous old one is dropped. A prefix in use is written
again on every request, so it stays young (an LRU at half the cost of an OrderedDict).
The cost is measured in benchmarks/bench_scaleout.py.
"""
from __future__ import annotations

import itertools
from typing import Optional, Sequence


class PrefixRouter:
    def __init__(self, num_replicas: int, block_size: int, *, prefix_aware: bool = True,
                 capacity: int = 1 << 16, max_blocks: int = 32, slack: int = 64) -> None:
        self.num_replicas = num_replicas
        self.block_size = block_size
        self.prefix_aware = prefix_aware
        self.capacity = capacity
        self.max_blocks = max_blocks
        self.slack = slack
        self._young: dict[int, int] = {}
        self._old: dict[int, int] = {}
        self._rotation = itertools.cycle(range(num_replicas))
        self.prefix_routed = 0  # requests sent to a replica for its cached prefix

    def depths(self, num_tokens: int) -> list[int]:
        """Block counts whose prefixes are hashed: 1, 2, 4, ... and the last full block."""
        full = min(num_tokens // self.block_size, self.max_blocks)
        out, d = [], 1
        while d < full:
            out.append(d)
            d *= 2
        return out + [full] if full else out

    def block_hashes(self, token_ids: Sequence[int], salt: Optional[str] = None) -> list[int]:
        """Chained hashes of the prompt's leading blocks, one per depth."""
        bs = self.block_size
        h, prev, out = hash(salt), 0, []
        for d in self.depths(len(token_ids)):
            h = hash((h, tuple(token_ids[prev * bs:d * bs])))
            out.append(h)
            prev = d
        return out

    def least_loaded(self, loads: Sequence[int], alive: Sequence[bool]) -> int:
        start = next(self._rotation)
        order = [(start + k) % self.num_replicas for k in range(self.num_replicas)]
        live = [i for i in order if alive[i]]
        if not live:
            raise LookupError("no replica is up")
        return min(live, key=lambda i: loads[i])

    def route(self, token_ids: Optional[Sequence[int]], loads: Sequence[int],
              alive: Sequence[bool], salt: Optional[str] = None) -> int:
        """The replica for a prompt (token ids, or None when not tokenized here)."""
        best = self.least_loaded(loads, alive)
        if not self.prefix_aware or token_ids is None:
            return best
        hashes = self.block_hashes(token_ids, salt)
        owner = None
        for h in hashes:
            replica = self._young.get(h)
            if replica is None:
                replica = self._old.get(h)
            if replica is None:
                break
            owner = replica
        if owner is not None and alive[owner] and loads[owner] <= loads[best] + self.slack:
            best = owner
            self.prefix_routed += 1
        self._remember(hashes, best)
        return best

    def _remember(self, hashes: list[int], replica: int) -> None:
        if len(self._young) + len(hashes) > self.capacity // 2:
            self._old, self._young = self._young, {}
        young = self._young
        for h in hashes:
            young[h] = replica

    def forget(self, replica: int) -> None:
        """A replica restarted with an empty cache: drop what it held."""
        for table in (self._young, self._old):
            for h in [h for h, r in table.items() if r == replica]:
                del table[h]

    def __len__(self) -> int:
        return len(self._young) + len(self._old)
