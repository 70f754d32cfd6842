"""EngineStats: an engine's counters since start-up (no torch: the server's metrics and
every request front read them)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    """Counters since start-up (read by tests and exported by the server)."""

    num_steps: int = 0
    num_requests_finished: int = 0
    prompt_tokens: int = 0           # tokens of finished requests' prompts
    computed_tokens: int = 0         # tokens actually run through the model
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_split_requests: int = 0      # finished requests computed over 2+ steps
    num_evictions: int = 0
    num_preemptions: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_deduplicated: int = 0        # requests answered by an identical one in flight
