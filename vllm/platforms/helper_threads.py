"""One OpenMP team per server process: the engine thread's.

libgomp gives every thread that starts a parallel region a team of its own, whose workers
stay for the thread's life. Once a second team exists there are more OpenMP threads than
cores, and libgomp's idle workers stop spin-waiting between parallel regions: every small
parallel op of the engine's steps then waits for a sleeping worker to wake. Measured here
(torch.add of 400k floats, 2 cores): 58 us on the engine's team alone, 147 us once another
thread had run one bfloat16 cast of a [200, 384] tensor; a server that answered one
`/pooling` token_embed request with `embed_dtype: bfloat16` kept that second team for life.

So the server's other threads (the tokenizer thread, the threads that stream long answers
or check LoRA adapters) call `serial_torch_here` before they touch a tensor: torch ops on
them run on that thread alone, inline, and start no team. Their tensor work (casting a
token-level output, a ColBERT MaxSim) is small next to a step. A thread the server borrows
from its caller (uvicorn's event loop, the start-up check of `--lora-modules`) goes serial
only inside `serial_torch()`, which gives the caller its thread count back: a public call
never changes its caller's OpenMP settings.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from typing import Iterator, Optional

_local = threading.local()  # .serial: this thread's answer, once asked


@functools.cache
def _libgomp() -> Optional[ctypes.CDLL]:
    """The OpenMP runtime torch loaded (same SONAME, so dlopen returns that copy)."""
    try:
        lib = ctypes.CDLL("libgomp.so.1")
        lib.omp_set_num_threads.argtypes = [ctypes.c_int]
        return lib
    except (OSError, AttributeError):
        return None


def serial_torch_here() -> bool:
    """Make torch ops on the calling thread run without an OpenMP team (once per thread;
    cheap after). False where torch's OpenMP runtime is not libgomp. Never call it on the
    thread that runs the model."""
    if getattr(_local, "serial", None) is not None:
        return _local.serial
    import torch
    torch.get_num_threads()  # torch's per-thread lazy init first: it sets the thread count
    lib = _libgomp()
    if lib is not None:
        lib.omp_set_num_threads(1)
    _local.serial = lib is not None and torch.get_num_threads() == 1
    return _local.serial


@contextlib.contextmanager
def serial_torch() -> Iterator[None]:
    """`serial_torch_here` for a borrowed thread: inside, torch ops on the calling thread
    run without an OpenMP team; on exit the thread has its own thread count back (a thread
    already made serial for good stays so)."""
    if getattr(_local, "serial", None) is not None:
        yield
        return
    import torch
    before = torch.get_num_threads()
    serial_torch_here()
    try:
        yield
    finally:
        lib = _libgomp()
        if lib is not None:
            lib.omp_set_num_threads(before)
        del _local.serial
