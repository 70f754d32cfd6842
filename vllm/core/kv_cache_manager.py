"""KVCacheManager: which blocks each request holds, and prefix-cache hits.

Hashes chain block by block: hash(parent hash, the block's token ids, extra keys such
as a cache salt), so equal hashes mean equal whole prefixes.

A prompt's last, partial block is cached too (copy-on-write): a request that knows its
first `prompt_len` tokens are a shared run (a sentence-transformers prompt) registers
that block's valid slots under hash(parent hash, the run's tokens in it), for every cut
of the run (a BPE tokenizer may merge the prompt's last token with the text's first),
once its step has written them; a later request continuing the same tokens gets a fresh
block of its own, the runner copies those slots into it before the step's forward pass,
and only the request's own tokens are computed.
"""
from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass
from typing import Optional

from vllm.core.block_pool import Block, BlockPool
from vllm.core.request import Request


def _seed(extra: Optional[str], pool_key: Optional[str] = None) -> bytes:
    # 0xff never occurs in UTF-8, so a salt alone never equals a salt plus a pool key.
    seed = (extra or "").encode()
    return seed + b"\xff" + pool_key.encode() if pool_key else seed


def hash_blocks(token_ids: list[int], block_size: int, extra: Optional[str] = None,
                pool_key: Optional[str] = None,
                position_keys: Optional[list[tuple[int, str]]] = None) -> list[bytes]:
    """Chained hashes of every full block of `token_ids` (seeded by the salt `extra` and
    the pooling payload's setting `pool_key`); a block also covers the `position_keys`
    (position, key) whose position falls in it (an image's content hash at its first
    placeholder token), and the chain carries them on."""
    hashes: list[bytes] = []
    parent = _seed(extra, pool_key)
    keys = sorted(position_keys or ())
    data = memoryview(array("q", token_ids)).cast("B")  # one conversion, sliced per block
    width = 8 * block_size
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        h = hashlib.sha256(parent)
        h.update(data[8 * start: 8 * start + width])
        for pos, key in keys:
            if start <= pos < start + block_size:
                h.update(b"\xff" + key.encode())
        parent = h.digest()
        hashes.append(parent)
    return hashes


def hash_runs(parent: bytes, token_ids: list[int]) -> list[bytes]:
    """Hashes of the runs token_ids[:1], token_ids[:2], ... after the full blocks that
    `parent` ends (each run shorter than a block)."""
    h = hashlib.sha256(parent)
    out = []
    for token in token_ids:
        h.update(array("q", [token]).tobytes())
        out.append(h.copy().digest())
    return out


@dataclass
class PartialHit:
    """`block`'s first `num_tokens` slots hold the request's tokens right after its full
    hits; the runner copies them into the request's own block (`BlockCopy`)."""
    block: Block
    num_tokens: int


@dataclass
class BlockCopy:
    """Copy slots 0..num_slots-1 of block `src` into block `dst`, before the forward."""
    src: int
    dst: int
    num_slots: int


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool,
                 cache_partials: bool = True) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_caching = enable_caching
        # Off where a partial block's copied slots would lack their pooling payload
        # (CLS/MEAN/ALL/STEP pooling, whose payloads are kept per full block).
        self.cache_partials = cache_partials
        self.req_blocks: dict[str, list[Block]] = {}
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0     # tokens found

    def prepare(self, request: Request) -> None:
        """Hash the request's full prompt blocks (and its prompt's partial block) once."""
        if self.enable_caching and not request.block_hashes:
            request.block_hashes = hash_blocks(request.prompt_token_ids, self.block_size,
                                               request.hash_extra, request.pool_key,
                                               request.position_keys)
            cut = (request.prompt_len or 0) if self.cache_partials else 0
            i, rest = divmod(cut, self.block_size)
            if rest and cut <= request.num_tokens:
                start = i * self.block_size
                request.partial_run = (cut, hash_runs(
                    self._parent(request, i), request.prompt_token_ids[start:cut]))

    def _parent(self, request: Request, i: int) -> bytes:
        """The chained hash block `i` of `request` continues."""
        return request.block_hashes[i - 1] if i else _seed(request.hash_extra,
                                                           request.pool_key)

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

    def find_partial(self, request: Request, num_hit: int) -> Optional[PartialHit]:
        """The longest cached partial run continuing `request` after its `num_hit` tokens
        of full-block hits, never covering its last token; None when there is none."""
        if not self.enable_caching or not self.pool.has_partials:
            return None
        limit = min(self.block_size - 1, request.num_tokens - 1 - num_hit)
        runs = hash_runs(self._parent(request, num_hit // self.block_size),
                         request.prompt_token_ids[num_hit: num_hit + limit])
        for j in range(len(runs), 0, -1):
            block = self.pool.lookup_partial(runs[j - 1])
            if block is not None:
                return PartialHit(block, j)
        return None

    def copy_for(self, request: Request, hit: PartialHit) -> BlockCopy:
        """The copy that gives `request`'s own block (after its full hits) `hit`'s slots;
        call after `allocate_slots` succeeded with num_computed_tokens past the run."""
        blocks = self.req_blocks[request.request_id]
        dst = blocks[(request.num_computed_tokens - hit.num_tokens) // self.block_size]
        return BlockCopy(hit.block.block_id, dst.block_id, hit.num_tokens)

    def cache_partial(self, request: Request) -> None:
        """After a step wrote `request`'s tokens: once they cover its prompt, register the
        prompt's partial block. Only now, so a reader's copy (run before its step's
        forward) never reads slots that the same step writes."""
        if request.partial_run is None:
            return
        cut, run_hashes = request.partial_run
        blocks = self.req_blocks.get(request.request_id)
        if blocks and request.num_computed_tokens >= cut:
            self.pool.cache_partial(blocks[cut // self.block_size], run_hashes)

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
