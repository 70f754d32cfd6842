"""C++ CPU kernels from `csrc/`, built on first use with torch's extension tooling.

`pip install` compiles nothing: the first engine that wants a kernel builds it with the
system C++ compiler for the CPU it runs on (`-O3 -march=native`) into torch's extension
cache (`TORCH_EXTENSIONS_DIR`, default ~/.cache/torch_extensions), which later processes
reuse; the cache name carries a hash of the CPU's flags, so a shared home directory never
hands one CPU a binary built for another. Where a kernel cannot be had (no AVX-512, no
compiler, a source-less install, `VLLM_CPU_KERNELS=0`) callers use PyTorch, and
`kernel_status()` says why.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import time
from typing import Callable, Optional

import torch

from vllm.logger import init_logger

logger = init_logger(__name__)

CSRC = pathlib.Path(__file__).resolve().parents[3] / "csrc"
_status: dict[str, str] = {}


def _cpu_flags() -> set[str]:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _unavailable(name: str, reason: str) -> None:
    _status[name] = f"unavailable ({reason})"
    return None


@functools.lru_cache(maxsize=None)
def varlen_attention_kernel() -> Optional[Callable]:
    """`f(q, k, v, q_offsets, k_offsets, key_rows, tile_ids, scale, causal) -> out`
    (float32 [T, H, D]; empty key_rows / tile_ids: keys are rows of k in order; see
    csrc/varlen_attention.cpp), or None where it cannot be built."""
    name = "varlen_attention"
    if os.environ.get("VLLM_CPU_KERNELS", "1") == "0":
        return _unavailable(name, "VLLM_CPU_KERNELS=0")
    flags = _cpu_flags()
    if "avx512f" not in flags:
        return _unavailable(name, "the CPU has no AVX-512")
    source = CSRC / "varlen_attention.cpp"
    if not source.exists():
        return _unavailable(name, f"{source} is not there (not a source checkout)")
    tag = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:10]
    start = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load
        module = load(name=f"vllm_varlen_attention_{tag}", sources=[str(source)],
                      extra_cflags=["-O3", "-march=native", "-fopenmp"], verbose=False)
    except Exception as exc:  # no compiler, no ninja, a compile error: fall back
        return _unavailable(name, f"build failed: {str(exc).splitlines()[0][:200]}")
    _status[name] = f"ready ({time.perf_counter() - start:.1f} s to build or load)"
    return module.varlen_attention


def kernel_status(name: str) -> str:
    return _status.get(name, "not requested")


def use_varlen_attention(x: torch.Tensor, head_dim: int) -> bool:
    """Whether attention over `x` (queries) can run on the C++ kernel: float32, or
    bfloat16 computed in float32 (1.8x torch's bfloat16 SDPA on MiniLM's shapes, and
    exact-er)."""
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16)
            and head_dim % 16 == 0 and head_dim <= 256
            and varlen_attention_kernel() is not None)
