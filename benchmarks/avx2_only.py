"""Run a command as on an AVX2-only x86 CPU (AMD Zen 2/3), on a CPU with AVX-512.

    python benchmarks/avx2_only.py python benchmarks/bench_openvino.py --texts 256
    python benchmarks/avx2_only.py python -m pytest -p no:faulthandler tests

The command runs with `avx2_only/cpuid_mask.c` preloaded: through Linux's CPUID faulting,
every library that asks the CPU what it has (oneDNN in torch, MLAS in ONNX Runtime,
OpenVINO's CPU plugin, torch's own kernels, gcc's `-march=native`) is told AVX2 and FMA
without any AVX-512, VNNI, BF16 or AMX, and /proc/cpuinfo (where this engine looks) shows the
same. Unlike `ONEDNN_MAX_CPU_ISA=AVX2`, which caps torch's oneDNN alone, this caps every
peer in a benchmark, so ONNX Runtime and OpenVINO run their AVX2 code too. The engine's
kernel library is built for the masked CPU (`-march=native` under the shim gives what an
install on a Zen 3 gives) unless VLLM_CPU_KERNELS_LIB is already set.

It is Zen 4 (or whichever CPU this is) running AVX2 code: the instructions a Zen 2/3 runs,
not its timings. Needs `cpuid_fault` in /proc/cpuinfo's flags (Linux >= 4.12 on a CPU or
hypervisor that offers CPUID faulting); elsewhere it says so and exits 2.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / "avx2_only" / "cpuid_mask.c"
BUILD = HERE / "results" / ".avx2_only"
# glibc picks its string functions before any preload runs; its tunables can drop AVX-512
GLIBC_MASK = "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD"


def supported() -> bool:
    """Whether this CPU and kernel offer CPUID faulting (the shim's mechanism)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(line.startswith("flags") and "cpuid_fault" in line.split()
               for line in text.splitlines())


def shim() -> pathlib.Path:
    """The built shim (rebuilt when its source is newer)."""
    lib = BUILD / "libcpuid_mask.so"
    if not lib.exists() or lib.stat().st_mtime < SOURCE.stat().st_mtime:
        BUILD.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-Wall", "-shared", "-fPIC", "-o", str(lib), str(SOURCE),
                        "-ldl"], check=True)
    return lib


def environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default os.environ) with the shim preloaded and glibc's AVX-512 off."""
    env = dict(os.environ if base is None else base)
    env["LD_PRELOAD"] = " ".join(filter(None, [str(shim()), env.get("LD_PRELOAD", "")]))
    env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES", ""), GLIBC_MASK]))
    return env


def kernels() -> pathlib.Path:
    """The engine's kernel library as an install on the masked CPU builds it (CMake reruns
    only what changed)."""
    root = HERE.parent
    where = BUILD / "kernels"
    env = environment()
    for cmd in (["cmake", "-S", str(root), "-B", str(where), "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(where), "-j2"]):
        subprocess.run(cmd, check=True, capture_output=True, env=env)
    return where / "libvllm_cpu_kernels.so"


def avx2_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """Everything a child process needs to run as on an AVX2-only CPU."""
    env = environment(base)
    env.setdefault("VLLM_CPU_KERNELS_LIB", str(kernels()))
    return env


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if not supported():
        print("avx2_only: no `cpuid_fault` in /proc/cpuinfo: this CPU or kernel cannot mask "
              "CPUID; use ONEDNN_MAX_CPU_ISA=AVX2 with an x86-64-v3 kernel build instead",
              file=sys.stderr)
        return 2
    return subprocess.run(argv, env=avx2_environment()).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
