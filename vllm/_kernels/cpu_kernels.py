"""The C++ CPU kernels from `csrc/`: one shared library built at install, loaded with ctypes.

`pip install` runs CMake (setup.py, CMakeLists.txt) and puts `libvllm_cpu_kernels.so` in
`vllm/_kernels/`, built for the installing CPU (AVX-512 or AVX2 attention; RMSNorm on any
CPU). The library has a plain C interface on raw pointers, so the build needs no torch;
it is loaded after torch, so its OpenMP is the libgomp torch already loaded, and each call
passes torch's thread count. Where the library is missing (no compiler at install), fails
to load, or was built for instructions this CPU lacks, the engine logs one WARNING and uses
its torch paths; `kernel_status()` says why. `VLLM_CPU_KERNELS_JIT=1` (developers: a
source checkout on PYTHONPATH) builds a missing library with CMake on first use instead,
into `$XDG_CACHE_HOME/vllm/cpu_kernels/<hash of the CPU's flags>`, under an OS file lock.
`VLLM_CPU_KERNELS_LIB=PATH` loads that library instead (an AVX2 build tested on an AVX-512
CPU: tests/test_packed_threads.py).
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import pathlib
import subprocess
from typing import Callable, Optional

import torch

from vllm import envs
from vllm.logger import init_logger

logger = init_logger(__name__)

LIB_NAME = "libvllm_cpu_kernels.so"
PACKAGED = pathlib.Path(__file__).resolve().parent / LIB_NAME
ROOT = pathlib.Path(__file__).resolve().parents[2]  # a source checkout's root
REBUILD = ('reinstall with CMake, a C++ compiler and OpenMP (`pip install -e .`), or set '
           'VLLM_CPU_KERNELS_JIT=1 to build them on first use')
ISA_FLAGS = {"avx512": {"avx512f"}, "avx2": {"avx2", "fma"}, "none": set()}
_status: dict[str, str] = {}
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_NORM = [_PTR, _PTR, ctypes.c_float]  # a fused LayerNorm's weight, bias, eps


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags from /proc/cpuinfo (empty where there is none), read once: the
    bf16 attention kernel's check runs per forward, and /proc/cpuinfo took 43 us to read on
    2 cores (it grows with the core count)."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def build_dir() -> pathlib.Path:
    """Where VLLM_CPU_KERNELS_JIT builds the library for this CPU."""
    tag = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:10]
    cache = envs.XDG_CACHE_HOME or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(cache) / "vllm" / "cpu_kernels" / tag


def jit_build() -> pathlib.Path:
    """Configure and build CMakeLists.txt under an OS lock (released if this process dies);
    CMake rebuilds only what changed. Raises where it fails."""
    where = build_dir()
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "vllm-build.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        for cmd in (["cmake", "-S", str(ROOT), "-B", str(where), "-DCMAKE_BUILD_TYPE=Release"],
                    ["cmake", "--build", str(where)]):
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode:
                raise RuntimeError((run.stderr or run.stdout).strip().splitlines()[-1][:200])
    return where / LIB_NAME


def _find() -> tuple[Optional[pathlib.Path], str]:
    """The library to load, or None and why."""
    if envs.VLLM_CPU_KERNELS_LIB:
        chosen = pathlib.Path(envs.VLLM_CPU_KERNELS_LIB)
        return (chosen, "") if chosen.exists() else (None, f"VLLM_CPU_KERNELS_LIB: no {chosen}")
    if PACKAGED.exists():
        return PACKAGED, ""
    if not envs.VLLM_CPU_KERNELS_JIT:
        return None, f"not built at install: no {PACKAGED}"
    if not (ROOT / "CMakeLists.txt").exists():
        return None, "VLLM_CPU_KERNELS_JIT=1 needs a source checkout"
    try:
        return jit_build(), ""
    except (OSError, RuntimeError) as exc:
        return None, f"VLLM_CPU_KERNELS_JIT build failed: {exc}"


@functools.lru_cache(maxsize=None)
def library() -> Optional[ctypes.CDLL]:
    """The loaded kernel library, or None (logged once, with how to get it)."""
    if not envs.VLLM_CPU_KERNELS:
        _status["library"] = "unavailable (VLLM_CPU_KERNELS=0)"
        return None
    path, why = _find()
    lib = None
    if path is not None:
        try:
            lib = _bind(ctypes.CDLL(str(path)))
            isa = lib.vllm_kernels_isa().decode()
            missing = sorted(ISA_FLAGS.get(isa, {isa}) - cpu_flags())
            if missing:
                lib, why = None, f"{path} was built for {isa}; this CPU lacks {missing[0]}"
        except (OSError, AttributeError) as exc:
            lib, why = None, f"{path} does not load: {exc}"
    if lib is None:
        _status["library"] = f"unavailable ({why})"
        logger.warning("C++ CPU kernels unavailable (%s): attention and RMSNorm use the "
                       "torch paths; to rebuild, %s.", why, REBUILD)
        return None
    _status["library"] = f"ready ({isa}, {path})"
    logger.info("C++ CPU kernels: %s (%s)", path, isa)
    return lib


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.vllm_kernels_isa.restype = ctypes.c_char_p
    lib.vllm_varlen_attention.restype = ctypes.c_int
    lib.vllm_varlen_attention.argtypes = (
        [_PTR, _I64, _I64] * 3 + [_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _PTR, _I64,
                                  _PTR, _I64, ctypes.c_float, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_char_p, _I64])
    lib.vllm_rms_norm.restype = None
    lib.vllm_rms_norm.argtypes = [_PTR, _PTR, _PTR] + [_I64] * 5 + [ctypes.c_float,
                                                                     ctypes.c_int, ctypes.c_int]
    lib.vllm_skinny_gemm_tile_width.restype = ctypes.c_int
    lib.vllm_skinny_gemm.restype = ctypes.c_int
    lib.vllm_skinny_gemm.argtypes = ([_PTR, _I64, _I64, _I64, _PTR, _I64, _I64, _I64, _PTR,
                                      _PTR, _I64, ctypes.c_int, _PTR, _I64, ctypes.c_int])
    if hasattr(lib, "vllm_f32_gemm"):  # absent from libraries built before session 23
        lib.vllm_f32_gemm_built.restype = lib.vllm_f32_gemm_block.restype = ctypes.c_int
        lib.vllm_f32_gemm.restype = ctypes.c_int
        lib.vllm_f32_gemm.argtypes = ([_PTR, _I64, _I64, _I64, _PTR, _I64, _PTR, _PTR, _I64,
                                       ctypes.c_int] + _NORM + [_PTR, _I64, ctypes.c_int])
    lib.vllm_quantize_rows.restype = ctypes.c_int
    lib.vllm_quantize_rows.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, ctypes.c_int]
    lib.vllm_layer_norm_rows.argtypes = [_PTR, _I64, _I64, _I64] + _NORM + [_PTR, ctypes.c_int]
    lib.vllm_dequantize_rows.restype = ctypes.c_int
    lib.vllm_dequantize_rows.argtypes = ([_PTR, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _I64,
                                          ctypes.c_int, _PTR, ctypes.c_int])
    if hasattr(lib, "vllm_int8_gemm_avx2"):  # absent from libraries built before it
        lib.vllm_int8_gemm_avx2_built.restype = ctypes.c_int
        lib.vllm_int8_gemm_avx2_block.restype = ctypes.c_int
        if hasattr(lib, "vllm_int8_gemm_avx2_group"):  # libraries before session 22: 4
            lib.vllm_int8_gemm_avx2_group.restype = ctypes.c_int
        if hasattr(lib, "vllm_int8_gemm_avx2_fused"):  # likewise: no fused float end
            lib.vllm_int8_gemm_avx2_fused.restype = ctypes.c_int
            lib.vllm_int8_gemm_avx2_fused.argtypes = (
                [_PTR, _I64, _I64, _I64, _PTR, _I64] + [_PTR] * 4 + [_I64, ctypes.c_int] +
                _NORM + [_PTR, _PTR, _PTR, _PTR, ctypes.c_int])
        lib.vllm_int8_gemm_avx2.restype = ctypes.c_int
        lib.vllm_int8_gemm_avx2.argtypes = ([_PTR, _I64, _I64, _I64, _PTR, _I64] +
                                            [_PTR] * 4 + [_I64, ctypes.c_int, _PTR,
                                                          ctypes.c_int])
    if hasattr(lib, "vllm_varlen_attention_bf16"):  # absent from libraries built before it
        lib.vllm_varlen_attention_bf16_built.restype = ctypes.c_int
        lib.vllm_varlen_attention_bf16.restype = ctypes.c_int
        lib.vllm_varlen_attention_bf16.argtypes = (
            [_PTR, _I64, _I64] * 3 + [_PTR, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                      _I64, _I64, _I64,
                                      _PTR, _PTR, _I64, _PTR, _I64, _PTR, _I64,
                                      ctypes.c_float, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_char_p, _I64])
    if hasattr(lib, "vllm_int8_gemm_vnni"):
        lib.vllm_int8_gemm_vnni_built.restype = ctypes.c_int
        lib.vllm_int8_gemm_vnni.restype = ctypes.c_int
        lib.vllm_int8_gemm_vnni.argtypes = ([_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64] +
                                            [_PTR] * 4 + [_I64, ctypes.c_int] + _NORM +
                                            [_PTR, _PTR, _PTR, _PTR, ctypes.c_int])
    if hasattr(lib, "vllm_int8_gemm_amx"):
        lib.vllm_int8_gemm_amx_built.restype = ctypes.c_int
        lib.vllm_int8_gemm_amx_permitted.restype = ctypes.c_int
        lib.vllm_int8_gemm_amx.restype = ctypes.c_int
        lib.vllm_int8_gemm_amx.argtypes = ([_PTR, _I64, _I64, _I64, _PTR, _I64] + [_PTR] * 4 +
                                           [_I64, ctypes.c_int] + _NORM +
                                           [_PTR, _PTR, _PTR, _PTR, ctypes.c_int])
    return lib


def varlen_attention_kernel() -> Optional[Callable]:
    """`f(q, k, v, q_offsets, k_offsets, key_rows, tile_ids, scale, causal) -> out`
    (float32 [T, H, D]; empty key_rows / tile_ids: keys are rows of k in order; see
    csrc/varlen_attention.cpp), or None where the library or a SIMD build is missing."""
    lib = library()
    if lib is None:
        _status["varlen_attention"] = _status["library"]
        return None
    if lib.vllm_kernels_isa() == b"none":
        _status["varlen_attention"] = "unavailable (built without AVX2 or AVX-512)"
        return None
    _status["varlen_attention"] = _status["library"]
    from vllm._kernels.cpu_kernel_calls import varlen_attention
    return functools.partial(varlen_attention, lib)


# /proc/cpuinfo flags the bfloat16 attention kernel (csrc/varlen_attention_bf16.cpp) needs
BF16_FLAGS = {"avx512f", "avx512bw", "avx512_bf16"}


def varlen_attention_bf16_kernel() -> Optional[Callable]:
    """`f(q, k, v, q_offsets, k_offsets, key_rows, tile_ids, scale, causal,
    out_dtype=torch.bfloat16, bf16_pv=False) -> out`: `varlen_attention_kernel`'s attention
    on bfloat16 q/k/v, Q*K^T with vdpbf16ps (softmax, sums and by default P*V in float32;
    csrc/varlen_attention_bf16.cpp), or
    None, its status saying why: no library, a library built without AVX512-BF16, or a CPU
    without it."""
    lib = library()
    name = "varlen_attention_bf16"
    if lib is None:
        _status[name] = _status["library"]
        return None
    if not hasattr(lib, f"vllm_{name}") or not lib.vllm_varlen_attention_bf16_built():
        _status[name] = "unavailable (the library was built without it: not for a CPU " \
            "with AVX512-BF16, or before it existed)"
        return None
    if not BF16_FLAGS <= cpu_flags():
        _status[name] = "unavailable (this CPU has no AVX512-BF16)"
        return None
    _status[name] = _status["library"]
    from vllm._kernels.cpu_kernel_calls import varlen_attention_bf16
    return functools.partial(varlen_attention_bf16, lib)


def rms_norm_kernel() -> Optional[Callable]:
    """`f(x, weight, eps) -> out`: RMSNorm of float32 / bfloat16 [N, D] or [N0, N1, D] rows
    in one pass (csrc/rms_norm.cpp), or None where the library is missing."""
    lib = library()
    _status["rms_norm"] = _status["library"]
    if lib is None:
        return None
    from vllm._kernels.cpu_kernel_calls import rms_norm
    return functools.partial(rms_norm, lib)


# Builds whose few-row kernel the engine runs: it beat oneDNN there (bench_projections.py).
# Every build that has the kernel is tested for correctness (`engine=False`).
SKINNY_GEMM_ENGINE_ISAS = ("avx2", "avx512")


def skinny_gemm_kernel(engine: bool = True) -> Optional[Callable]:
    """`f(x, weight_ptr, n, k, kp, nb, bias, mode, other) -> out` for a few float32 rows
    against a oneDNN-packed weight (csrc/skinny_gemm.cpp; `f.tile_width`: the block widths
    it takes are multiples of it), or None where the library is missing, or (`engine`)
    where the build's ISA is not one the engine runs it on (SKINNY_GEMM_ENGINE_ISAS)."""
    lib = library()
    isa = None if lib is None else lib.vllm_kernels_isa().decode()
    if lib is None or isa == "none" or (engine and isa not in SKINNY_GEMM_ENGINE_ISAS):
        _status["skinny_gemm"] = _status["library"] if lib is None else \
            f"unused on {isa} builds (measured faster than oneDNN only on " \
            f"{', '.join(SKINNY_GEMM_ENGINE_ISAS)})"
        return None
    _status["skinny_gemm"] = _status["library"]
    from vllm._kernels.cpu_kernel_calls import skinny_gemm
    kernel = functools.partial(skinny_gemm, lib)
    kernel.tile_width = lib.vllm_skinny_gemm_tile_width()
    return kernel


def f32_gemm_kernel() -> Optional[Callable]:
    """`f(x, packed, n, bias, mode, other=None, norm=None) -> float32 [M, n]`: the float32
    GEMM with its epilogue (and LayerNorm) in its last pass over a weight packed in blocks of
    `f.block` columns (csrc/f32_gemm.cpp, layers/f32_gemm.py), or None where the library
    or its SIMD build is missing (`kernel_status("f32_gemm")` says which)."""
    lib = library()
    if lib is None or not hasattr(lib, "vllm_f32_gemm") or not lib.vllm_f32_gemm_built():
        _status["f32_gemm"] = _status["library"] if lib is None else \
            "unavailable (a library without SIMD, or built before it existed)"
        return None
    _status["f32_gemm"] = _status["library"]
    from vllm._kernels.cpu_kernel_calls import f32_gemm
    kernel = functools.partial(f32_gemm, lib)
    kernel.block = lib.vllm_f32_gemm_block()
    return kernel


def int8_kernels() -> Optional[tuple[Callable, Callable]]:
    """(quantize_rows, dequantize_rows): the float ends of an int8 projection
    (csrc/int8_linear.cpp), or None where the library or a SIMD build is missing."""
    lib = library()
    if lib is None or lib.vllm_kernels_isa() == b"none":
        _status["int8"] = _status["library"] if lib is None else \
            "unavailable (built without AVX2 or AVX-512)"
        return None
    _status["int8"] = _status["library"]
    from vllm._kernels.cpu_kernel_calls import dequantize_rows, quantize_rows
    return functools.partial(quantize_rows, lib), functools.partial(dequantize_rows, lib)


def int8_layer_norm_kernel() -> Optional[Callable]:
    """`f(x, weight, bias, eps)`: LayerNorm of float32 rows as the fused int8 GEMMs apply
    it in their pass (csrc/int8_linear.cpp), for the int8 paths that normalise after the
    GEMM; None where `int8_kernels` is."""
    if int8_kernels() is None:
        return None
    from vllm._kernels.cpu_kernel_calls import layer_norm_rows
    return functools.partial(layer_norm_rows, library())


def _int8_gemm_kernel(name: str, flags: set[str], build: str, cpu: str
                      ) -> Optional[Callable]:
    """cpu_kernel_calls.`name` bound to the library (`f.block`: the packed weight's block of
    columns), or None, its status saying why: no library, a library built without
    `vllm_<name>` (`build`: which builds), or a CPU without `flags` (named `cpu`)."""
    lib = library()
    if lib is None:
        _status[name] = _status["library"]
        return None
    if not hasattr(lib, f"vllm_{name}") or not getattr(lib, f"vllm_{name}_built")():
        _status[name] = f"unavailable (the library was built without it: {build}, or " \
            "before it existed)"
        return None
    if not flags <= cpu_flags():
        _status[name] = f"unavailable (this CPU has no {cpu})"
        return None
    _status[name] = _status["library"]
    from vllm._kernels import cpu_kernel_calls
    kernel = functools.partial(getattr(cpu_kernel_calls, name), lib)
    kernel.block = lib.vllm_int8_gemm_avx2_block()  # the kernels' packed layout
    kernel.group = cpu_kernel_calls.avx2_group(lib) if name == "int8_gemm_avx2" else 4
    # whether it takes quantized= / floats= / norm= / out_dtype= (the fused float end)
    kernel.fused = name != "int8_gemm_avx2" or hasattr(lib, "vllm_int8_gemm_avx2_fused")
    return kernel


def int8_gemm_avx2_kernel() -> Optional[Callable]:
    """`f(q, packed, n, row_scales, col_scales, bias, mode, other=None, quantized=False,
    floats=True, norm=None, out_dtype=float32)`: the exact s8 x s8 GEMM for CPUs with AVX2
    and no int8 dot products, dequantized as `dequantize_rows` in the same pass
    (csrc/int8_gemm_avx2.cpp; `f.block`, `f.group`: the packed weight's block of columns
    and k per group, `pack_avx2(q, f.block, group=f.group)`; `f.fused`: the library has the
    fused float end the keywords need), or None where the library, its AVX2 build or this
    CPU's AVX2 is missing."""
    return _int8_gemm_kernel("int8_gemm_avx2", ISA_FLAGS["avx2"], "no AVX2", "AVX2")


# /proc/cpuinfo flags the VNNI int8 GEMM (csrc/int8_gemm_vnni.cpp) needs
VNNI_FLAGS = {"avx512f", "avx512bw", "avx512_vnni"}


def int8_gemm_vnni_kernel() -> Optional[Callable]:
    """`f(q, packed, comp, n, row_scales, col_scales, bias, mode, other=None) -> float32
    [M, n]`: the s8 x s8 GEMM on AVX512-VNNI over the packed weight (`pack_avx2`, group 4;
    and comp, 128 times its column sums), dequantized as `dequantize_rows` in the same pass
    (csrc/int8_gemm_vnni.cpp), or None where the library, its AVX512-VNNI build or this
    CPU's AVX512-VNNI is missing."""
    return _int8_gemm_kernel("int8_gemm_vnni", VNNI_FLAGS,
                             "not for a CPU with AVX512-VNNI", "AVX512-VNNI")


# /proc/cpuinfo flags the AMX int8 GEMM (csrc/int8_gemm_amx.cpp) needs
AMX_FLAGS = {"avx512f", "avx512bw", "amx_tile", "amx_int8"}


def int8_gemm_amx_kernel() -> Optional[Callable]:
    """`f(q, packed, n, row_scales, col_scales, bias, mode, other=None, quantized=False)`:
    the s8 x s8 GEMM on AMX-INT8 tiles over the packed weight (`pack_avx2`, group 4; with
    `f.slack` bytes after it), dequantized as `dequantize_rows` in the same pass
    (csrc/int8_gemm_amx.cpp), or None where the library, its AMX build or this CPU's
    AMX-INT8 is missing."""
    kernel = _int8_gemm_kernel("int8_gemm_amx", AMX_FLAGS, "not for a CPU with AMX-INT8",
                               "AMX-INT8")
    if kernel is not None and not library().vllm_int8_gemm_amx_permitted():
        _status["int8_gemm_amx"] = "unavailable (Linux refused this process AMX's tile " \
            "state: arch_prctl ARCH_REQ_XCOMP_PERM; kernels before 5.16)"
        return None
    if kernel is not None:
        from vllm._kernels.cpu_kernel_calls import AMX_SLACK
        kernel.slack = AMX_SLACK
    return kernel


def kernel_isa() -> Optional[str]:
    """What the loaded library was built for ("avx512", "avx2", "none"), or None."""
    lib = library()
    return None if lib is None else lib.vllm_kernels_isa().decode()


def kernel_status(name: str) -> str:
    return _status.get(name, "not requested")
