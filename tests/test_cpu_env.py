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
import ctypes, os, sys, tempfile, threading, torch
from vllm.platforms import cpu_malloc
tuned = (cpu_malloc.share_heap_across_threads() if sys.argv[1] == "share"
         else cpu_malloc.tune_malloc())
print("tuned", tuned)
print("parallel_tokenizer", os.environ.get("TOKENIZERS_PARALLELISM", "unset"))
libc = ctypes.CDLL("libc.so.6")
libc.fdopen.restype = ctypes.c_void_p
def arenas():  # malloc_info writes one <heap nr=...> per arena
    with tempfile.TemporaryFile() as f:
        stream = libc.fdopen(os.dup(f.fileno()), b"w")
        libc.malloc_info(0, ctypes.c_void_p(stream))
        libc.fclose(ctypes.c_void_p(stream))
        f.seek(0)
        return f.read().count(b"<heap nr=")
def faults():
    return int(open("/proc/thread-self/stat").read().rsplit(")", 1)[1].split()[7])
def work():
    torch.set_num_threads(1)
    for _ in range(20):  # warm-up: the heap settles (a few buffers' worth) and stays
        torch.empty(80 << 20, dtype=torch.uint8).fill_(1)
    start = faults()
    for _ in range(10):
        torch.empty(80 << 20, dtype=torch.uint8).fill_(1)
    print("faults_per_alloc", (faults() - start) / 10)
    print("arenas", arenas())
thread = threading.Thread(target=work)
thread.start()
thread.join()
"""


def _on_a_thread(mode: str, tuning: str = "1") -> dict[str, str]:
    env = {**os.environ, "VLLM_CPU_MALLOC_TUNING": tuning}
    for name in ("MALLOC_ARENA_MAX", "TOKENIZERS_PARALLELISM"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines()
                if line.startswith(("tuned ", "faults_per_alloc ", "arenas ",
                                    "parallel_tokenizer ")))


def test_engine_thread_buffers_reuse_the_shared_heap():
    """The server's engine thread: one heap for all threads, so big buffers are reused;
    the tokenizer's thread pool (which would queue on that heap's lock) is off."""
    pages = (80 << 20) // 4096
    shared = _on_a_thread("share")
    assert shared["tuned"] == "True" and shared["arenas"] == "1"
    assert float(shared["faults_per_alloc"]) < pages / 4, shared
    assert shared["parallel_tokenizer"] == "false"
    off = _on_a_thread("share", tuning="0")
    assert off["tuned"] == "False" and off["arenas"] == "2"
    assert float(off["faults_per_alloc"]) > pages / 2, off  # what sharing avoids
    assert off["parallel_tokenizer"] == "unset"


def test_offline_tuning_keeps_a_heap_per_thread():
    """Offline (engine on the caller's thread) only the thresholds change: other threads
    keep heaps of their own, and tokenizers keeps its thread pool."""
    tuned = _on_a_thread("tune")
    assert tuned["tuned"] == "True" and tuned["arenas"] == "2"
    assert tuned["parallel_tokenizer"] == "unset"


# How long torch's idle OpenMP worker keeps spinning after a parallel region: the CPU time
# the process's other threads use while the main thread sleeps 50 ms.
SPIN_SCRIPT = """
import os, threading, time
from vllm.platforms.process import limit_openmp_spin
print("limited", limit_openmp_spin())
import torch
print("libgomp", "libgomp" in open("/proc/self/maps").read())
torch.set_num_threads(2)
x = torch.randn(512, 512)
def others_ms():
    me, total = threading.get_native_id(), 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != me:
            total += int(open(f"/proc/self/task/{tid}/schedstat").read().split()[0])
    return total / 1e6
spins = []
for _ in range(5):
    x @ x
    before = others_ms()
    time.sleep(0.05)
    spins.append(others_ms() - before)
print("spin_ms", sorted(spins)[2])
"""


def _idle_spin_ms(**env_overrides: str) -> tuple[bool, bool, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", SPIN_SCRIPT], env={**env, **env_overrides},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    found = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    return found["limited"] == "True", found["libgomp"] == "True", float(found["spin_ms"])


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or
                    not pathlib.Path("/proc/self/task/%d/schedstat" % os.getpid()).exists(),
                    reason="an OpenMP worker of its own core, per-thread CPU time")
def test_served_openmp_workers_stop_spinning_soon():
    """`vllm serve` limits the spin before torch loads: the idle worker then sleeps after
    30k spin iterations (~1-4 ms on the machines measured, against ~9-13 ms for libgomp's
    default 300k); an explicit GOMP_SPINCOUNT is left alone (3M: the worker spins through
    most of the 50 ms sleep). A ratio within one run: absolute times follow the CPU's speed
    and the machine's load."""
    limited, libgomp, short = _idle_spin_ms()
    if not libgomp:
        pytest.skip("torch is not built with GNU OpenMP here")
    kept, _, long = _idle_spin_ms(GOMP_SPINCOUNT="3000000")
    assert limited and not kept
    assert long > 4 * short, (short, long)


def test_import_vllm_loads_torch_only_when_a_public_name_is_used():
    """`vllm serve` must set OpenMP's environment before torch loads, so `import vllm`
    (which `python -m vllm...` runs first) imports no torch; the names still resolve."""
    script = """
import sys, vllm
print("torch_after_import", "torch" in sys.modules)
from vllm import LLM, PoolingParams
print("names", LLM.__name__, PoolingParams.__name__, vllm.config.ModelConfig.__name__)
print("unknown", hasattr(vllm, "no_such_name"))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "torch_after_import False" in out
    assert "names LLM PoolingParams ModelConfig" in out and "unknown False" in out


HUGE_PAGE_SCRIPT = """
import os, sys
if sys.argv[1] == "torch-first":
    import torch, vllm
else:
    import vllm, torch
from vllm.platforms.cpu_malloc import huge_page_buffers
print(os.environ.get("THP_MEM_ALLOC_ENABLE"), huge_page_buffers())
"""


@pytest.mark.parametrize("order, env, expected", [
    ("vllm-first", None, "1 True"),     # set by `import vllm`, before torch's first allocation
    ("torch-first", None, "None False"),  # too late for this process: left unset
    ("vllm-first", "0", "0 False"),     # the user's choice is kept
])
def test_import_vllm_turns_on_huge_page_buffers_before_torch_loads(order, env, expected):
    """torch reads THP_MEM_ALLOC_ENABLE once, at its first allocation; with it, buffers of
    2 MiB and more are page-aligned (and advised onto transparent huge pages), which is
    what `huge_page_buffers` (logged at start-up) checks."""
    child = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if env is not None:
        child["THP_MEM_ALLOC_ENABLE"] = env
    out = subprocess.run([sys.executable, "-c", HUGE_PAGE_SCRIPT, order], env=child,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == expected
