"""benchmarks/avx2_only.py: a child process under the CPUID mask sees an AVX2-only CPU in
every place a library looks (the cpuid instruction, torch's dispatch, oneDNN, /proc/cpuinfo),
and a crash still reaches the program's own SIGSEGV handler."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "benchmarks"))

import avx2_only  # noqa: E402

from vllm._kernels.cpu_kernels import cpu_flags  # noqa: E402

pytestmark = pytest.mark.skipif(not avx2_only.supported(),
                                reason="no CPUID faulting (cpuid_fault) on this CPU or kernel")

PROBE = """
import ctypes, json, os, torch
from vllm._kernels.cpu_kernels import cpu_flags
from vllm._kernels.cpu_kernels import kernel_isa
from vllm.platforms import current_platform
print(json.dumps({"torch": torch.backends.cpu.get_cpu_capability(), "kernels": kernel_isa(),
                  "flags": sorted(f for f in cpu_flags() if "avx" in f or "amx" in f),
                  "int8": current_platform.int8_path()[0]}))
"""


def child(code: str) -> subprocess.CompletedProcess:
    """`code` under the mask, with the kernel library built as an install there builds it."""
    env = avx2_only.avx2_environment({k: v for k, v in os.environ.items()
                                      if k != "VLLM_CPU_KERNELS_LIB"})
    env.pop("VLLM_CPU_INT8_PATH", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.skipif("avx2" not in cpu_flags(), reason="the host has no AVX2 to keep")
def test_child_sees_an_avx2_only_cpu():
    import json
    run = child(PROBE)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["torch"] == "AVX2" and seen["kernels"] == "avx2"
    assert "avx2" in seen["flags"] and not [f for f in seen["flags"] if "512" in f]
    assert seen["int8"] == "AVX2"   # the engine's own choice: no VNNI, no AMX


def test_a_real_crash_reaches_the_programs_handler():
    run = child("import faulthandler, ctypes; faulthandler.enable(); ctypes.string_at(0)")
    assert run.returncode == -11   # SIGSEGV, after Python's handler ran
    assert "Segmentation fault" in run.stderr and "string_at" not in run.stdout
