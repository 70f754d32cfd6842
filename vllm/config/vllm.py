"""VllmConfig: every resolved setting in one object, with the gate applied."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vllm.config.cache import CacheConfig
from vllm.config.gate import resolve_feature
from vllm.config.lora import LoRAConfig
from vllm.config.model import ModelConfig
from vllm.config.scheduler import SchedulerConfig
from vllm.logger import init_logger

logger = init_logger(__name__)


@dataclass
class VllmConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    lora_config: Optional[LoRAConfig] = None  # enable_lora

    def __post_init__(self) -> None:
        mc = self.model_config
        self.cache_config.enable_prefix_caching = resolve_feature(
            "Prefix caching", self.cache_config.enable_prefix_caching, mc)
        self.scheduler_config.enable_chunked_prefill = resolve_feature(
            "Chunked prefill", self.scheduler_config.enable_chunked_prefill, mc)
        self.scheduler_config.finalize(mc.max_model_len)
        logger.info("%s", mc.pooler_config)
        logger.info("Supported tasks: %s", list(mc.supported_tasks))

    @property
    def uses_kv_cache(self) -> bool:
        """Causal models keep K/V in the paged cache; bidirectional ones keep none."""
        return self.model_config.is_causal
