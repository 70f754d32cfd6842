"""BlockPool: block ids, reference counts, an LRU free list and a hash -> block map.

Owns no tensor: the worker maps block ids to KV memory. A freed block keeps its hash
until it is handed out again, so a later request with the same prefix can revive it.

Besides its full-block hash, a block may carry partial hashes: each says its first j
slots hold a known token run (a prompt's last, partial block, cut at any j). Readers
never share such a block; they copy its valid slots into a block of their own (see
KVCacheManager.find_partial).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: Optional[bytes] = None
    # Hashes of runs its first slots hold (see KVCacheManager.cache_partial).
    partial_hashes: list[bytes] = field(default_factory=list)


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks, least recently used first (insertion order = free order).
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[bytes, Block] = {}
        self._partial: dict[bytes, Block] = {}
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    def lookup(self, block_hash: bytes) -> Optional[Block]:
        """The block holding `block_hash`, in use or free, or None."""
        return self._cached.get(block_hash)

    def lookup_partial(self, partial_hash: bytes) -> Optional[Block]:
        """The block whose first slots hold the run summarised by `partial_hash`, or None."""
        return self._partial.get(partial_hash)

    @property
    def has_partials(self) -> bool:
        return bool(self._partial)

    def touch(self, blocks: list[Block]) -> None:
        """Take a reference on cached blocks (reviving free ones out of the LRU list)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def allocate(self, n: int) -> list[Block]:
        """Hand out `n` free blocks, evicting the least recently used cached ones."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks, only {len(self._free)} free")
        out = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            if block.block_hash is not None or block.partial_hashes:
                self._forget(block)
                self.num_evictions += 1
            block.ref_cnt = 1
            out.append(block)
        return out

    def free(self, blocks: list[Block]) -> None:
        """Drop one reference each; blocks that reach zero join the free list's MRU end.

        Callers pass a request's blocks tail first, so its last (least shareable) blocks
        are evicted before its prefix.
        """
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def cache(self, block: Block, block_hash: bytes) -> None:
        """Record that a full `block` holds the tokens summarised by `block_hash`."""
        if block.block_hash is not None:
            return
        if block_hash in self._cached:  # an identical block already exists; keep that one
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def cache_partial(self, block: Block, partial_hashes: list[bytes]) -> None:
        """Record that the first slots of `block` (written in a finished step) hold the
        runs summarised by `partial_hashes`; a run already cached keeps its block."""
        for h in partial_hashes:
            if h not in self._partial:
                block.partial_hashes.append(h)
                self._partial[h] = block

    def _forget(self, block: Block) -> None:
        if block.block_hash is not None:
            del self._cached[block.block_hash]
            block.block_hash = None
        for h in block.partial_hashes:
            del self._partial[h]
        block.partial_hashes = []

    def reset_hashes(self) -> None:
        """Forget every cached hash (after a failed step wrote blocks it had promised)."""
        for block in list(self._cached.values()) + list(self._partial.values()):
            self._forget(block)
