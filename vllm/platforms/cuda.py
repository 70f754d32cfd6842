"""The CUDA platform: the checkpoint's half-precision dtype, a KV cache sized from
`gpu_memory_utilization`, and the attention backend.

Attention: TRITON_ATTN by default for a model whose steps can hold cache readers (causal
attention with prefix caching or chunked prefill on): its kernel reads a reader's cached keys
in place through the block table, where FLASH_ATTN first gathers them into a packed tensor,
and it measured at least as fast on an H200 (benchmarks/gpu_check.py). Otherwise torch's
flash attention; VLLM_ATTENTION_BACKEND always wins.

dtype="auto" follows upstream vLLM for pooling models: a float16/bfloat16 checkpoint runs
in its own dtype, a float32 (or unstated) one in float16.

KV cache, as upstream: the engine may use `gpu_memory_utilization` x the device's total
memory. The runner profiles the largest step the scheduler can make (no cache yet); the
cache gets that budget minus the profile's peak (weights + activations) minus memory held
outside torch's allocator (CUDA context, other processes' use counts too).

Serving: the model runs on the GPU, so the host's cores are free while a step runs: texts
are tokenized on the tokenizer thread as they arrive (overlapping the step), steps start as
soon as requests are there, and threads keep their own heaps.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from vllm.logger import init_logger
from vllm.platforms.interface import GiB, Platform, ServingPolicy, triton_attn_unavailable

logger = init_logger(__name__)

FLASH_DTYPES = (torch.float16, torch.bfloat16)


def cuda_cache_budget(total: int, utilization: float, peak: int, outside_torch: int) -> int:
    """utilization x total - profile peak - memory held outside torch's allocator (>= 0)."""
    return max(0, int(utilization * total) - peak - max(0, outside_torch))


class CudaPlatform(Platform):
    device_type = "cuda"

    def __init__(self, device: str) -> None:
        super().__init__(device)
        if self.device.index is None:  # torch.cuda's memory calls want an index
            self.device = torch.device("cuda", torch.cuda.current_device())

    def default_dtype(self, checkpoint_dtype: Optional[torch.dtype]) -> torch.dtype:
        return checkpoint_dtype if checkpoint_dtype in FLASH_DTYPES else torch.float16

    def _prepare(self, dtype: torch.dtype) -> None:
        torch.cuda.set_device(self.device)
        props = torch.cuda.get_device_properties(self.device)
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 stays float32 (parity)
        torch.backends.cudnn.allow_tf32 = False
        logger.info("CUDA device: %s, %.1f GiB, compute capability %d.%d; GEMMs: cuBLAS "
                    "(torch).", props.name, props.total_memory / GiB, props.major, props.minor)

    def serving_policy(self) -> ServingPolicy:
        return ServingPolicy(share_heap=False, arrival_window=False,
                             tokenize_between_steps=False)

    def kv_cache_bytes(self, cache_config, profile: Callable[[], None]) -> int:
        util = cache_config.gpu_memory_utilization
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        profile()
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        outside = (total - free) - torch.cuda.memory_reserved(self.device)
        budget = cuda_cache_budget(total, util, peak, outside)
        logger.info("KV cache budget: %.2f GiB = %.2f x %.1f GiB - %.2f GiB profile peak "
                    "(weights + activations) - %.2f GiB outside torch.", budget / GiB, util,
                    total / GiB, peak / GiB, max(0, outside) / GiB)
        return budget

    def backend_preference(self, dtype: torch.dtype) -> tuple[str, ...]:
        return ("FLASH_ATTN", "TORCH_SDPA")

    def default_backends(self, dtype: torch.dtype,
                         cache_readers: bool) -> tuple[tuple[str, ...], str]:
        """TRITON_ATTN first for a model whose steps can hold cache readers (see module doc),
        else flash attention."""
        if cache_readers:
            return ("TRITON_ATTN",) + self.backend_preference(dtype), (
                "CUDA default for causal attention with prefix caching or chunked prefill: "
                "it reads cached keys in place, where FLASH_ATTN gathers them")
        return self.backend_preference(dtype), "CUDA default for a model without cache readers"

    def backend_unavailable(self, name: str, dtype: torch.dtype,
                            head_dims: Sequence[int]) -> Optional[str]:
        if name == "TORCH_SDPA":
            return None
        if name == "TRITON_ATTN":
            why_not = triton_attn_unavailable(dtype, head_dims)
            if why_not is None and dtype == torch.bfloat16 and \
                    torch.cuda.get_device_capability(self.device) < (8, 0):
                why_not = "bfloat16 Triton dots need compute capability 8.0 or newer"
            return why_not
        if name != "FLASH_ATTN":
            return super().backend_unavailable(name, dtype, head_dims)
        if dtype not in FLASH_DTYPES:
            return f"flash attention runs float16 and bfloat16, not {str(dtype)[6:]}"
        bad = sorted({d for d in head_dims if d % 8 or d > 256})
        if bad:
            return f"head size {bad[0]} is not a multiple of 8 up to 256"
        if torch.cuda.get_device_capability(self.device) < (8, 0):
            return "flash attention needs compute capability 8.0 or newer"
        if not torch.backends.cuda.is_flash_attention_available():
            return "this torch build has no flash attention"
        return None

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)
