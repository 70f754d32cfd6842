"""Process settings that make CPU inference fast: keep large buffers in the heap.

glibc serves allocations above its mmap threshold (at most 32 MiB) with fresh mmap'd
pages and unmaps them on free, so every big activation tensor of a step ([tokens x
intermediate] floats) is page-faulted in again: element-wise ops ran 2-4x slower here.
Raising the mmap and trim thresholds keeps freed blocks for reuse, as the tcmalloc /
jemalloc preload recommended for vLLM on CPU would. The heap then stays at its high-water
mark, which a long-running engine reaches anyway.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

from vllm.logger import init_logger

logger = init_logger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def tune_malloc() -> bool:
    """Raise glibc's mmap/trim thresholds once per process; False where not applicable
    (not glibc, or VLLM_CPU_MALLOC_TUNING=0)."""
    global _done
    if _done:
        return True
    if os.environ.get("VLLM_CPU_MALLOC_TUNING", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1 and mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1
    if ok:
        _done = True
        logger.info("CPU allocator: large buffers kept in the heap for reuse "
                    "(VLLM_CPU_MALLOC_TUNING=0 turns this off).")
    return ok
