"""EngineArgs: vLLM's engine keyword arguments, validated and turned into a VllmConfig."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional, Union

from vllm.config import CacheConfig, ModelConfig, PoolerConfig, SchedulerConfig, VllmConfig
from vllm.config.lora import LoRAConfig
from vllm.logger import init_logger

logger = init_logger(__name__)

# vLLM arguments that change nothing on this engine: accepted and logged once.
IGNORED_ARGS = (
    "enforce_eager", "swap_space", "cpu_offload_gb",
    "disable_log_stats", "max_seq_len_to_capture", "disable_custom_all_reduce",
    "compilation_config", "distributed_executor_backend", "load_format", "tokenizer_mode",
    "tokenizer_revision", "code_revision", "download_dir", "disable_async_output_proc",
    "worker_cls", "kv_cache_dtype", "max_logprobs", "skip_tokenizer_init",
    "served_model_name", "enable_prefix_caching_hash_algo", "prefix_caching_hash_algo",
    "async_scheduling", "disable_log_requests", "enable_log_requests",
    "calculate_kv_scales", "override_generation_config", "generation_config",
    "guided_decoding_backend", "logits_processor_pattern", "scheduling_policy",
    "max_num_partial_prefills", "cuda_graph_sizes", "disable_sliding_window", "hf_token",
)
# Arguments that would change results or resources and that this engine cannot honour:
# name -> the value that means "off".
UNSUPPORTED_ARGS: dict[str, Any] = {
    "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1,
    "speculative_config": None,
    "enable_expert_parallel": False,
    "rope_scaling": None, "rope_theta": None,
}


@dataclass
class EngineArgs:
    model: str
    tokenizer: Optional[str] = None
    runner: str = "auto"
    convert: str = "auto"
    task: Optional[str] = None
    dtype: str = "auto"
    quantization: Optional[str] = None
    max_model_len: Optional[int] = None
    hf_overrides: Optional[dict[str, Any]] = None
    override_pooler_config: Optional[Union[PoolerConfig, dict]] = None
    trust_remote_code: bool = False
    revision: Optional[str] = None
    model_impl: str = "auto"
    device: str = "auto"
    seed: int = 0
    block_size: int = 16
    enable_prefix_caching: Optional[bool] = None
    enable_chunked_prefill: Optional[bool] = None
    max_num_batched_tokens: Optional[int] = None
    max_num_seqs: int = 128
    long_prefill_token_threshold: Optional[int] = None
    num_gpu_blocks_override: Optional[int] = None
    gpu_memory_utilization: float = 0.9
    truncation_side: Optional[str] = None
    embedding_calibration: Optional[str] = None
    rerank_max_chunks_per_doc: int = 0
    chat_template: Optional[str] = None
    limit_mm_per_prompt: Optional[dict[str, Any]] = None
    allowed_local_media_path: Optional[str] = None
    allowed_media_domains: Optional[list[str]] = None
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: Optional[int] = None

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> "EngineArgs":
        """Build from `LLM(...)`-style keywords: aliases mapped, no-ops logged, bad ones refused."""
        if "pooler_config" in kwargs:
            pooler = kwargs.pop("pooler_config")
            if kwargs.get("override_pooler_config") is not None and pooler is not None:
                raise ValueError("Pass only one of pooler_config and override_pooler_config.")
            kwargs["override_pooler_config"] = pooler
        known = {f.name for f in fields(cls)}
        for name in [k for k in kwargs if k in UNSUPPORTED_ARGS]:
            value = kwargs.pop(name)
            if value not in (UNSUPPORTED_ARGS[name], None, False):
                raise ValueError(f"{name}={value!r} is not supported by this engine "
                                 "(single-device pooling engine); remove it.")
        ignored = [k for k in kwargs if k in IGNORED_ARGS]
        for name in ignored:
            logger.info("Ignoring %s=%r: it has no effect on this engine.", name, kwargs.pop(name))
        unknown = [k for k in kwargs if k not in known]
        if unknown:
            raise ValueError(f"Unknown engine argument(s): {', '.join(sorted(unknown))}.")
        return cls(model=model, **kwargs)

    def create_engine_config(self) -> VllmConfig:
        model_config = ModelConfig(
            model=self.model, tokenizer=self.tokenizer, runner=self.runner,
            convert=self.convert, task=self.task, dtype=self.dtype,
            quantization=self.quantization,
            max_model_len=self.max_model_len, hf_overrides=self.hf_overrides,
            override_pooler_config=self.override_pooler_config,
            trust_remote_code=self.trust_remote_code, revision=self.revision,
            model_impl=self.model_impl, device=self.device, seed=self.seed,
            truncation_side=self.truncation_side,
            embedding_calibration=self.embedding_calibration,
            rerank_max_chunks_per_doc=self.rerank_max_chunks_per_doc,
            chat_template=self.chat_template,
            limit_mm_per_prompt=self.limit_mm_per_prompt,
            allowed_local_media_path=self.allowed_local_media_path,
            allowed_media_domains=self.allowed_media_domains)
        cache_config = CacheConfig(block_size=self.block_size,
                                   enable_prefix_caching=self.enable_prefix_caching,
                                   num_gpu_blocks_override=self.num_gpu_blocks_override,
                                   gpu_memory_utilization=self.gpu_memory_utilization)
        scheduler_config = SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            enable_chunked_prefill=self.enable_chunked_prefill,
            long_prefill_token_threshold=self.long_prefill_token_threshold)
        return VllmConfig(model_config, cache_config, scheduler_config, self._lora_config())

    def _lora_config(self) -> Optional[LoRAConfig]:
        """LoRAConfig when enable_lora (int8 projections cannot take an adapter's delta)."""
        if not self.enable_lora:
            return None
        if self.quantization == "int8":
            raise ValueError("enable_lora cannot be combined with quantization='int8': LoRA "
                             "adds to float projections; drop one of them.")
        return LoRAConfig(self.max_loras, self.max_lora_rank, self.max_cpu_loras)
