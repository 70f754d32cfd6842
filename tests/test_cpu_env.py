"""The allocator tuning: a thread that allocates step-sized buffers reuses the heap
instead of page-faulting them in again on every allocation."""
from __future__ import annotations

import os
import pathlib
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"
    or not pathlib.Path("/proc/thread-self/stat").exists(),
    reason="glibc's mallopt and Linux per-thread fault counters")

# 80 MiB is larger than a glibc thread arena's 64 MiB heap: without a shared heap such a
# buffer is mmap'd and unmapped on every allocation, i.e. 20k pages faulted in each time.
SCRIPT = """
import threading, torch
from vllm.worker.cpu_env import tune_malloc
print("tuned", tune_malloc())
def faults():
    return int(open("/proc/thread-self/stat").read().rsplit(")", 1)[1].split()[7])
def work():
    torch.set_num_threads(1)
    torch.empty(80 << 20, dtype=torch.uint8).fill_(1)  # the heap grows once
    start = faults()
    for _ in range(10):
        torch.empty(80 << 20, dtype=torch.uint8).fill_(1)
    print("faults_per_alloc", (faults() - start) / 10)
thread = threading.Thread(target=work)
thread.start()
thread.join()
"""


def _faults_per_alloc(tuning: str) -> tuple[bool, float]:
    env = {**os.environ, "VLLM_CPU_MALLOC_TUNING": tuning}
    env.pop("MALLOC_ARENA_MAX", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    found = dict(line.split(" ", 1) for line in out.splitlines()
                 if line.startswith(("tuned ", "faults_per_alloc ")))
    return found["tuned"] == "True", float(found["faults_per_alloc"])


def test_engine_thread_buffers_reuse_the_heap():
    pages = (80 << 20) // 4096
    tuned, faults = _faults_per_alloc("1")
    assert tuned and faults < pages / 4, faults
    untuned, faults_off = _faults_per_alloc("0")
    assert not untuned and faults_off > pages / 2, faults_off  # what the tuning avoids
