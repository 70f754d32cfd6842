"""SchedulerConfig: the per-step token budget and sequence cap."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass
class SchedulerConfig:
    """`enable_chunked_prefill` is resolved by the gate, then `finalize` sets the budget."""

    max_num_batched_tokens: Optional[int] = None
    max_num_seqs: int = 128
    enable_chunked_prefill: Optional[bool] = None
    # Most tokens one request may take in a step (chunked prefill only), so a long prompt
    # leaves room for others in every step. None: half the budget; 0: no cap.
    long_prefill_token_threshold: Optional[int] = None
    max_model_len: int = 0

    def finalize(self, max_model_len: int) -> None:
        """Fix the budget once chunking and max_model_len are known."""
        self.max_model_len = max_model_len
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1.")
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = DEFAULT_MAX_NUM_BATCHED_TOKENS if \
                self.enable_chunked_prefill else max(DEFAULT_MAX_NUM_BATCHED_TOKENS,
                                                     max_model_len)
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be at least 1.")
        if self.long_prefill_token_threshold is None:
            self.long_prefill_token_threshold = max(1, self.max_num_batched_tokens // 2)
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be 0 (no cap) or positive.")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({max_model_len}) while chunked prefill is off, so a long "
                "prompt could never be scheduled. Raise max_num_batched_tokens, lower "
                "max_model_len, or enable chunked prefill (causal models only).")

    @property
    def chunk_cap(self) -> Optional[int]:
        """The per-request token cap in a step; None without chunking or without a cap."""
        if not self.enable_chunked_prefill or not self.long_prefill_token_threshold:
            return None
        return self.long_prefill_token_threshold
