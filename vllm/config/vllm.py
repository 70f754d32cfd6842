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
        """Causal models keep K/V in the paged cache; bidirectional ones keep none, nor
        does a Transformers backbone that runs whole sequences with its own attention."""
        return self.model_config.is_causal and not self.model_config.whole_sequences

    def run_whole_sequences(self, reason: str) -> None:
        """The model found at load that it cannot take the engine's attention (the
        Transformers backend's probe): turn prefix caching and chunked prefill off before
        the scheduler is built."""
        self.model_config.mark_whole_sequences(reason)
        self.cache_config.enable_prefix_caching = False
        self.scheduler_config.enable_chunked_prefill = False
        self.scheduler_config.finalize(self.model_config.max_model_len)
