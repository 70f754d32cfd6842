"""Builds the C++ CPU kernels (csrc/, via CMakeLists.txt) into vllm/_kernels/ at install.

Metadata lives in pyproject.toml. The kernels are optional: where there is no CMake, no
C++ compiler or OpenMP, or the build fails, the install still succeeds without them, and
the engine logs one warning at start-up and uses its torch paths
(vllm/_kernels/cpu_kernels.py).
"""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
LIB = "libvllm_cpu_kernels.so"


def build_kernels(dest: pathlib.Path) -> str:
    """Configure and build with CMake into a temporary folder, copy the library to `dest`;
    returns '' or why it was not built."""
    cmake = shutil.which("cmake")
    if cmake is None:
        return "no cmake on PATH"
    with tempfile.TemporaryDirectory(prefix="vllm-kernels-") as tmp:
        jobs = str(max(1, min(4, os.cpu_count() or 1)))
        for cmd in ([cmake, "-S", str(ROOT), "-B", tmp, "-DCMAKE_BUILD_TYPE=Release"],
                    [cmake, "--build", tmp, "-j", jobs]):
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode:
                tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
                return f"`{' '.join(cmd[:2])}` failed: {' | '.join(tail)}"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(pathlib.Path(tmp) / LIB, dest / (LIB + ".new"))
        os.replace(dest / (LIB + ".new"), dest / LIB)  # a running engine keeps its copy
    return ""


class CMakeKernels(build_ext):
    """Builds the one CMake target instead of setuptools' extensions; never fails the
    install. In place (an editable install imports from the source tree) the library goes
    to vllm/_kernels/ of the checkout, else to the build folder that becomes the wheel."""

    def run(self) -> None:
        where = ROOT if self.inplace else pathlib.Path(self.build_lib)
        why = build_kernels(where / "vllm" / "_kernels")
        if why:
            print(f"WARNING: vllm's C++ CPU kernels were not built ({why}); the engine "
                  "will use its torch paths.", file=sys.stderr)

    def copy_extensions_to_source(self) -> None:
        pass  # run() already built in place

    def get_outputs(self) -> list:
        lib = pathlib.Path(self.build_lib) / "vllm" / "_kernels" / LIB
        return [str(lib)] if not self.inplace and lib.exists() else []

    def get_output_mapping(self) -> dict:
        return {}


setup(ext_modules=[Extension("vllm._kernels.vllm_cpu_kernels", sources=[])],
      cmdclass={"build_ext": CMakeKernels})
