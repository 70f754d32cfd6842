from vllm.config.cache import CacheConfig
from vllm.config.model import ModelConfig
from vllm.config.pooler import PoolerConfig
from vllm.config.scheduler import SchedulerConfig
from vllm.config.vllm import VllmConfig

__all__ = ["CacheConfig", "ModelConfig", "PoolerConfig", "SchedulerConfig", "VllmConfig"]
