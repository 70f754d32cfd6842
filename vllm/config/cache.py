"""CacheConfig: paged KV cache geometry and prefix caching."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class CacheConfig:
    """`enable_prefix_caching` is resolved to a bool by the gate in `VllmConfig`."""

    block_size: int = 16
    enable_prefix_caching: Optional[bool] = None
    num_gpu_blocks_override: Optional[int] = None
    cpu_kvcache_space_bytes: Optional[int] = None  # None: VLLM_CPU_KVCACHE_SPACE (platform)
    gpu_memory_utilization: float = 0.9
    num_blocks: Optional[int] = None  # set by the worker once it has sized the pool

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be a positive number of tokens.")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization} must be in "
                             "(0, 1]: the fraction of the GPU's memory this engine may use.")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError("num_gpu_blocks_override must be at least 1.")
