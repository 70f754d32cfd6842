"""glibc allocator settings for CPU inference (the CPU platform applies them, logged).

glibc serves allocations above its mmap threshold (at most 32 MiB) with fresh mmap'd
pages and unmaps them on free, so every big activation tensor of a step ([tokens x
intermediate] floats) is page-faulted in again: element-wise ops ran 2-4x slower here.
Raising the mmap and trim thresholds keeps freed blocks for reuse, as the tcmalloc /
jemalloc preload recommended for vLLM on CPU would. The heap then stays at its high-water
mark, which a long-running engine reaches anyway. (torch asks for 64-byte aligned
blocks, which glibc cannot carve from a freed block of exactly the same size, so the heap
settles only after a few steps, at a few times the largest buffer: ~5x for a repeated
80 MiB buffer here, then no page faults.)

The server runs the engine on a thread of its own, and glibc gives each new thread an arena
of 64 MiB heaps: a buffer larger than that is mmap'd and unmapped on every step whatever
the threshold (an 80 MiB buffer cost 20k page faults per allocation on a thread, 512 on the
main heap), and the served forward pass ran about 6% slower than the same steps on the main
thread. So the server makes every thread share the main heap (`share_heap_across_threads`:
M_ARENA_MAX=1, set before the engine thread exists: glibc binds a thread to its arena at
its first allocation). Only the server: with one heap, threads that allocate at the same
time queue on its lock, and the Rust tokenizer's parallel batches then ran 3x slower (310
vs 97 us per text, 256 texts on two threads) -- slower than one thread (164 us). So the
server also turns tokenizers' thread pool off (it tokenizes a step's ~32 texts on one
thread anyway), and offline `LLM`, whose engine runs on the caller's thread, keeps
per-thread heaps and tokenizes large batches on both cores.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import time
from typing import Callable, Optional

from vllm import envs
from vllm.logger import init_logger
from vllm.platforms.process import single_threaded_tokenizer

logger = init_logger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_tuned = False
_shared = False


def _mallopt() -> Optional[Callable[[int, int], int]]:
    """glibc's mallopt, or None (not glibc, or VLLM_CPU_MALLOC_TUNING=0)."""
    if not envs.VLLM_CPU_MALLOC_TUNING:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.mallopt
    except (OSError, AttributeError):
        return None


def tune_malloc() -> bool:
    """Once per process: glibc's mmap/trim thresholds raised so large buffers stay in the
    heap for reuse; False where not applicable (not glibc, or VLLM_CPU_MALLOC_TUNING=0)."""
    global _tuned
    if _tuned:
        return True
    mallopt = _mallopt()
    if mallopt is None:
        return False
    _tuned = (mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1
              and mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1)
    if _tuned:
        logger.info("CPU allocator: large buffers kept in the heap for reuse "
                    "(VLLM_CPU_MALLOC_TUNING=0 turns this off).")
    return _tuned


def share_heap_across_threads() -> bool:
    """For a process whose engine runs on a thread of its own (the server): `tune_malloc`,
    one heap for every thread, and tokenizers' thread pool off unless
    TOKENIZERS_PARALLELISM is set. Call it before that thread starts."""
    global _shared
    mallopt = _mallopt()
    if _shared or mallopt is None or not tune_malloc():
        return _shared
    _shared = mallopt(_M_ARENA_MAX, 1) == 1
    if _shared:
        logger.info("CPU allocator: one heap for all threads, so the engine thread's large "
                    "buffers stay in it.")
        if single_threaded_tokenizer():
            logger.info("Tokenizer: one thread per batch (TOKENIZERS_PARALLELISM=false): "
                        "on one shared heap its parallel batches ran 3x slower.")
    return _shared


# A server engine returns the heap's free pages to the OS once it has been idle this long
# after steps (longer than a pause between bursts of traffic, whose next step would fault
# the pages back in), and at most once per interval.
HEAP_TRIM_IDLE_S = 10.0
HEAP_TRIM_INTERVAL_S = 10.0


class HeapTrimmer:
    """glibc's malloc_trim(0) for a server engine that has had no work for `idle_s` after
    steps, at most once per `interval_s` (the server's `IdleTask`). With the raised
    thresholds the heap never shrinks by itself; malloc_trim hands the free pages inside
    it back (MADV_DONTNEED) and keeps the address space, so what stays resident after a
    burst of traffic or one huge request is what is in use.

    Only when idle: the pages a later step touches fault back in (a MiniLM server's
    ~300 MiB of free step buffers, 450 -> 750 MiB of RSS again within one step of 128
    texts). Trimming every 10 s while busy (issue 17 item 4) cost sustained traffic 3-7%:
    two servers side by side, 5 interleaved rounds of 512 texts, 32 clients 0.927x ->
    0.978x of offline `LLM.embed`, all texts in one request 0.902x -> 0.962x, the server's
    CPU seconds -3% / -6% (benchmarks/README.md, session 14). The price is a higher peak
    inside one long request (its freed step buffers stay resident until it ends)."""

    def __init__(self, trim: Callable[[int], int], idle_s: float = HEAP_TRIM_IDLE_S,
                 interval_s: float = HEAP_TRIM_INTERVAL_S) -> None:
        self._trim = trim
        self.idle_s, self.interval_s = idle_s, interval_s
        self._last = -float("inf")
        self.num_trims = 0

    @classmethod
    def create(cls, **kwargs: float) -> Optional["HeapTrimmer"]:
        """None where malloc_trim is not available (not glibc) or tuning is off."""
        if _mallopt() is None:
            return None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            return cls(libc.malloc_trim, **kwargs)
        except (OSError, AttributeError):
            return None

    def delay(self) -> float:
        """Idle seconds before the next trim: `idle_s`, or longer to keep the interval."""
        return max(self.idle_s, self._last + self.interval_s - time.monotonic())

    def __call__(self) -> None:
        self._trim(0)
        self._last = time.monotonic()
        self.num_trims += 1


def huge_page_buffers() -> bool:
    """Whether torch page-aligns CPU buffers of 2 MiB and more and advises transparent huge
    pages for them: THP_MEM_ALLOC_ENABLE=1 was in the environment at torch's first
    allocation (`vllm.platforms.process`). Otherwise they are 64-byte aligned, and three
    fresh ones all on a page boundary by chance is about one in 2.6e5."""
    import torch
    buffers = [torch.empty(1 << 20) for _ in range(3)]  # 4 MiB each
    return all(b.data_ptr() % 4096 == 0 for b in buffers)
