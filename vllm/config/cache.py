"""CacheConfig: paged KV cache geometry and prefix caching."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

_GiB = 1 << 30


@dataclass
class CacheConfig:
    """`enable_prefix_caching` is resolved to a bool by the gate in `VllmConfig`."""

    block_size: int = 16
    enable_prefix_caching: Optional[bool] = None
    num_gpu_blocks_override: Optional[int] = None
    cpu_kvcache_space_bytes: Optional[int] = None
    gpu_memory_utilization: float = 0.9
    num_blocks: Optional[int] = None  # set by the worker once it has sized the pool

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be a positive number of tokens.")
        if self.cpu_kvcache_space_bytes is None:
            space = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4") or 4)
            self.cpu_kvcache_space_bytes = int(space * _GiB)
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError("num_gpu_blocks_override must be at least 1.")
