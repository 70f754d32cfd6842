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
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({max_model_len}) while chunked prefill is off, so a long "
                "prompt could never be scheduled. Raise max_num_batched_tokens, lower "
                "max_model_len, or enable chunked prefill (causal LAST-pooling models only).")
