"""C++ CPU kernels from `csrc/`, built on first use with torch's extension tooling.

`pip install` compiles nothing: the first engine that wants a kernel builds it with the
system C++ compiler for the CPU it runs on (`-O3 -march=native`) into
`$XDG_CACHE_HOME/vllm/cpu_kernels/<name>_<hash of the CPU's flags>` (default ~/.cache), which
later processes reuse; the hash keeps a shared home directory from handing one CPU a binary
built for another. Builds are serialised by an OS file lock, which dies with its process:
torch's own lock file, which a build killed mid-way leaves behind and on which every later
start would wait forever, is cleared under it. Where a kernel cannot be had (no AVX-512, no
compiler, a source-less install, `VLLM_CPU_KERNELS=0`) callers use PyTorch, and
`kernel_status()` says why.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import pathlib
import time
from typing import Callable, Optional

import torch

from vllm import envs
from vllm.logger import init_logger

logger = init_logger(__name__)

CSRC = pathlib.Path(__file__).resolve().parents[3] / "csrc"
_status: dict[str, str] = {}


def cpu_flags() -> set[str]:
    """The CPU feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def build_dir(name: str) -> pathlib.Path:
    """Where kernel `name` is built for this CPU."""
    tag = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:10]
    cache = envs.XDG_CACHE_HOME or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(cache) / "vllm" / "cpu_kernels" / f"{name}_{tag}"


def _build(name: str, source: pathlib.Path):
    """Build (or load) one extension module under an OS lock; clear a stale torch lock."""
    from torch.utils.cpp_extension import load
    where = build_dir(name)
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "vllm-build.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released by the OS if this process dies
        (where / "lock").unlink(missing_ok=True)  # torch's, left by a killed build
        return load(name=f"vllm_{where.name}", sources=[str(source)],
                    extra_cflags=["-O3", "-march=native", "-fopenmp"],
                    build_directory=str(where), verbose=False)


def _unavailable(name: str, reason: str) -> None:
    _status[name] = f"unavailable ({reason})"
    return None


@functools.lru_cache(maxsize=None)
def _module(name: str, needs_avx512: bool):
    """The built extension module for csrc/<name>.cpp, or None (and why, in the status)."""
    if not envs.VLLM_CPU_KERNELS:
        return _unavailable(name, "VLLM_CPU_KERNELS=0")
    if needs_avx512 and "avx512f" not in cpu_flags():
        return _unavailable(name, "the CPU has no AVX-512")
    source = CSRC / f"{name}.cpp"
    if not source.exists():
        return _unavailable(name, f"{source} is not there (not a source checkout)")
    start = time.perf_counter()
    try:
        module = _build(name, source)
    except Exception as exc:  # no compiler, no ninja, a compile error: fall back
        return _unavailable(name, f"build failed: {str(exc).splitlines()[0][:200]}")
    _status[name] = f"ready ({time.perf_counter() - start:.1f} s to build or load)"
    return module


def varlen_attention_kernel() -> Optional[Callable]:
    """`f(q, k, v, q_offsets, k_offsets, key_rows, tile_ids, scale, causal) -> out`
    (float32 [T, H, D]; empty key_rows / tile_ids: keys are rows of k in order; see
    csrc/varlen_attention.cpp), or None where it cannot be built."""
    module = _module("varlen_attention", True)
    return None if module is None else module.varlen_attention


def rms_norm_kernel() -> Optional[Callable]:
    """`f(x, weight, eps) -> out`: RMSNorm of float32 / bfloat16 [N, D] or [N0, N1, D] rows
    in one pass (csrc/rms_norm.cpp), or None where it cannot be built."""
    module = _module("rms_norm", False)
    return None if module is None else module.rms_norm


def kernel_status(name: str) -> str:
    return _status.get(name, "not requested")
