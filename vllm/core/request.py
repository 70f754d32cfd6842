"""A request as the scheduler sees it: tokens, progress, blocks, hashes."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Optional


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass
class Request:
    """`num_computed_tokens` catches up to `num_tokens`; then the request is pooled.

    `pooling_params` is opaque to `core/` (it is handed back to the runner untouched).
    """

    request_id: str
    prompt_token_ids: list[int]
    pooling_params: Any = None
    token_type_ids: Optional[list[int]] = None
    cache_salt: Optional[str] = None
    # The LoRA adapter's identity (its id and content digest; a checkpoint's task adapter:
    # `task:<name>`), None for the base model: it enters the block hashes beside the cache
    # salt, so adapters never share cached K/V.
    lora_key: Optional[str] = None
    # Leading tokens that are a known shared run (a sentence-transformers prompt): the KV
    # cache keeps their partial last block too; MEAN/CLS pooling may exclude them.
    prompt_len: Optional[int] = None
    # What a cached block's pooling payload depends on besides its tokens (e.g. MEAN's
    # left-out prompt length), hashed with the blocks; opaque to `core/` like the salt.
    pool_key: Optional[str] = None
    # An image prompt's pixels (its ids are placeholders); opaque to `core/`, handed to the
    # runner untouched.
    images: Any = None
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0          # prefix-cache hit at first scheduling
    num_steps: int = 0                  # steps in which some of its tokens were computed
    num_preemptions: int = 0
    block_hashes: list[bytes] = field(default_factory=list)
    # (prompt_len, hashes of every cut of its partial last block): see KVCacheManager
    partial_run: Optional[tuple[int, list[bytes]]] = None
    # The worker's partial pooled result across chunks (CLS/MEAN/ALL/STEP); opaque here.
    pool_state: Any = field(default=None, compare=False, repr=False)

    @property
    def hash_extra(self) -> Optional[str]:
        """What enters the first block's hash besides token ids: cache salt and adapter."""
        if self.lora_key is None:
            return self.cache_salt
        return f"{self.cache_salt or ''}\x00lora:{self.lora_key}"

    @property
    def position_keys(self) -> Optional[list[tuple[int, str]]]:
        """(token position, content key) pairs the block hashes cover: each image's hash at
        its first placeholder (the opaque `images` may name them), else None."""
        return getattr(self.images, "position_keys", None)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_remaining(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.ABORTED)
