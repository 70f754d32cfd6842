"""LoRAConfig: how many adapters a step mixes, how many stay loaded, the largest rank."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class LoRAConfig:
    """`max_loras`: distinct adapters in one step; `max_cpu_loras`: adapters kept loaded
    (least recently used ones are dropped and reloaded from disk on their next use; default
    `max_loras`); `max_lora_rank`: the largest rank an adapter may have (upstream's 16)."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_loras, int) or self.max_loras < 1:
            raise ValueError(f"max_loras={self.max_loras!r} must be an integer >= 1.")
        if not isinstance(self.max_lora_rank, int) or self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank={self.max_lora_rank!r} must be an integer >= 1.")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        elif self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= "
                             f"max_loras ({self.max_loras}).")
