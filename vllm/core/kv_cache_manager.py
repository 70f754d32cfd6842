"""KVCacheManager: which blocks each request holds, and prefix-cache hits.

Hashes chain block by block: hash(parent hash, the block's token ids, extra keys such
as a cache salt), so equal hashes mean equal whole prefixes.
"""
from __future__ import annotations

import hashlib
from array import array
from typing import Optional

from vllm.core.block_pool import Block, BlockPool
from vllm.core.request import Request


def hash_blocks(token_ids: list[int], block_size: int,
                extra: Optional[str] = None) -> list[bytes]:
    """Chained hashes of every full block of `token_ids`."""
    hashes: list[bytes] = []
    parent = (extra or "").encode()
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        h = hashlib.sha256(parent)
        h.update(array("q", token_ids[start: start + block_size]).tobytes())
        parent = h.digest()
        hashes.append(parent)
    return hashes


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.req_blocks: dict[str, list[Block]] = {}
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0     # tokens found

    def prepare(self, request: Request) -> None:
        """Hash the request's full prompt blocks once, at arrival."""
        if self.enable_caching and not request.block_hashes:
            request.block_hashes = hash_blocks(request.prompt_token_ids, self.block_size,
                                               request.cache_salt)

    def get_computed_blocks(self, request: Request) -> tuple[list[Block], int]:
        """The longest cached prefix of `request`, never covering its last token."""
        if not self.enable_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[Block] = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_lookup(self, num_queried: int, num_hit: int) -> None:
        """Count one successful admission's lookup (tokens asked, tokens found)."""
        if self.enable_caching:
            self.prefix_cache_queries += num_queried
            self.prefix_cache_hits += num_hit

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed: Optional[list[Block]] = None) -> bool:
        """Give `request` blocks for `num_new_tokens` more tokens (after `computed` hits).

        Returns False, changing nothing, when the pool cannot supply them.
        """
        computed = computed or []
        held = self.req_blocks.get(request.request_id, [])
        total_tokens = request.num_computed_tokens + num_new_tokens
        needed = -(-total_tokens // self.block_size) - len(held) - len(computed)
        reviving = sum(1 for b in computed if b.ref_cnt == 0)
        if needed > self.pool.num_free - reviving:
            return False
        self.pool.touch(computed)
        blocks = self.req_blocks.setdefault(request.request_id, [])
        blocks.extend(computed)
        if needed > 0:
            blocks.extend(self.pool.allocate(needed))
        if self.enable_caching:
            self._cache_full_blocks(request, blocks, total_tokens)
        return True

    def _cache_full_blocks(self, request: Request, blocks: list[Block], num_tokens: int) -> None:
        # Blocks full once this step's tokens are written. Within a step every layer
        # writes all new K/V before any request reads, so same-step sharers read them safely.
        for i in range(num_tokens // self.block_size):
            self.pool.cache(blocks[i], request.block_hashes[i])

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix; blocks in use keep their contents."""
        self.pool.reset_hashes()

    def block_ids(self, request: Request) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(request.request_id, [])]

    def free(self, request: Request) -> None:
        """Release the request's blocks (tail first); hashed ones stay revivable."""
        blocks = self.req_blocks.pop(request.request_id, [])
        self.pool.free(list(reversed(blocks)))

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free
