"""The attention backends by name (no torch here: the platform validates names early)."""
from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.attention.backends.abstract import AttentionBackend

# name -> (module, class); upstream vLLM's names, as VLLM_ATTENTION_BACKEND takes them.
_BACKENDS = {
    "CPU_NATIVE": ("vllm.attention.backends.cpu_native", "CpuNativeBackend"),
    "TORCH_SDPA": ("vllm.attention.backends.torch_sdpa", "TorchSdpaBackend"),
    "FLASH_ATTN": ("vllm.attention.backends.flash_attn", "FlashAttentionBackend"),
    "TRITON_ATTN": ("vllm.attention.backends.triton_attn", "TritonAttentionBackend"),
}
BACKEND_NAMES = tuple(_BACKENDS)


def check_backend_name(name: str) -> str:
    """`name` if it is a backend; otherwise a ValueError naming the valid ones."""
    if name not in _BACKENDS:
        raise ValueError(f"Unknown attention backend {name!r} (VLLM_ATTENTION_BACKEND); valid "
                         f"backends: {', '.join(BACKEND_NAMES)}.")
    return name


@functools.lru_cache(maxsize=None)
def get_backend(name: str) -> "AttentionBackend":
    """The (stateless, shared) backend object called `name`."""
    module, cls = _BACKENDS[check_backend_name(name)]
    return getattr(importlib.import_module(module), cls)()
