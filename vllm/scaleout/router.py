"""Prefix-aware routing: a prompt goes to the replica that cached its leading blocks.

The router keeps its own view of which replica computed which prompt prefixes: the chained
hashes of a prompt's leading full blocks (the engine's block size), each mapped to the last
replica it was sent to. A new prompt walks its block hashes; the deepest hit names the
replica that most likely still holds those blocks in its prefix cache. Without a hit, or
when that replica is busier than the least-loaded one by more than `slack` requests, the
least-loaded replica takes it (ties rotate).

Bounds: only the first `max_blocks` blocks of a prompt are hashed (prefixes that agree that
far are one family), and the table is an LRU of at most `capacity` entries, so memory is
O(capacity) and the cost per request O(max_blocks) whatever the traffic. The cost is
measured in benchmarks/bench_router.py.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
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
        self._table: OrderedDict[int, int] = OrderedDict()
        self._rotation = itertools.cycle(range(num_replicas))
        self.prefix_routed = 0  # requests sent to a replica for its cached prefix

    def block_hashes(self, token_ids: Sequence[int], salt: Optional[str] = None) -> list[int]:
        """Chained hashes of the leading full blocks (at most `max_blocks`)."""
        bs = self.block_size
        n = min(len(token_ids) // bs, self.max_blocks)
        h = hash(salt)
        out = []
        for i in range(n):
            h = hash((h, tuple(token_ids[i * bs:(i + 1) * bs])))
            out.append(h)
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
            replica = self._table.get(h)
            if replica is None:
                break
            owner = replica
        if owner is not None and alive[owner] and loads[owner] <= loads[best] + self.slack:
            best = owner
            self.prefix_routed += 1
        self._remember(hashes, best)
        return best

    def _remember(self, hashes: list[int], replica: int) -> None:
        table = self._table
        for h in hashes:
            table[h] = replica
            table.move_to_end(h)
        while len(table) > self.capacity:
            table.popitem(last=False)

    def forget(self, replica: int) -> None:
        """A replica restarted with an empty cache: drop what it held."""
        for h in [h for h, r in self._table.items() if r == replica]:
            del self._table[h]

    def __len__(self) -> int:
        return len(self._table)
