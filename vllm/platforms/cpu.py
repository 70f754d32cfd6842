"""The CPU platform: float32 by default, a fixed KV budget, C++ kernels where installed.

Process settings (`cpu_malloc`): glibc keeps large buffers in the heap; the server shares
one heap across threads and tokenizes on one thread. torch's huge-page buffers were asked
for before torch loaded (`process`); this logs whether they are on. Projections run on
oneDNN with fused epilogues where it passes its self-check (`layers.linear`), RMSNorm and
attention on the C++ kernels in csrc/, built at install (`vllm._kernels.cpu_kernels`; where they
were not, one WARNING at start-up and the torch paths).

Serving: on cores shared with the model, tokenizing on another thread while a step runs
stalls the step's OpenMP threads each time it preempts one (+6% requests/s at 32 clients
when the engine loop tokenizes between steps instead), and a drained engine that waits a
few ms for the clients it just answered (`ArrivalWindow`) runs steps twice as large.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import torch

from vllm import envs
from vllm.logger import init_logger
from vllm.platforms import cpu_malloc
from vllm.platforms.interface import (GiB, IdleTask, Platform, ServingPolicy,
                                      triton_attn_unavailable)
from vllm.platforms.process import SHAPE_CACHE_ENVS

logger = init_logger(__name__)

KERNEL_DTYPES = (torch.float32, torch.bfloat16)
# /proc/cpuinfo flag -> name: the int8 dot products `quantization="int8"` runs on oneDNN
# with (int8_linear.DOT_FLAGS; other AVX2 CPUs run its C++ AVX2 kernel)
INT8_FLAGS = {"avx512_vnni": "AVX512-VNNI", "avx_vnni": "AVX-VNNI", "amx_int8": "AMX-INT8"}


@functools.lru_cache(maxsize=None)
def _skinny_kernel() -> Optional[Callable]:
    """The C++ few-row kernel where built and matching F.linear on oneDNN's packed weights,
    else None (logged once)."""
    from vllm._kernels.cpu_kernels import kernel_status, skinny_gemm_kernel
    from vllm.model_executor.layers.skinny_gemm import MAX_ROWS, kernel_matches_torch
    kernel = skinny_gemm_kernel()
    if kernel is None:
        logger.info("Projections of few rows: the GEMM's own; C++ kernel %s",
                    kernel_status("skinny_gemm"))
        return None
    if not kernel_matches_torch(kernel):
        logger.warning("Projections of few rows: the GEMM's own; the C++ kernel does not read "
                       "this oneDNN's packed weights or differs from F.linear")
        return None
    logger.info("Projections of up to %d rows: C++ few-row kernel on the packed weights "
                "(VLLM_CPU_SKINNY_GEMM=0 turns it off)", MAX_ROWS)
    return kernel


F32_GEMM_CHOICES = ("auto", "cpp", "onednn")  # VLLM_CPU_F32_GEMM


@functools.lru_cache(maxsize=None)
def _cpp_f32_gemm():
    """The C++ float32 GEMM (layers.f32_gemm.CppGemm) where built and matching torch, else
    None (logged once)."""
    from vllm._kernels.cpu_kernels import f32_gemm_kernel, kernel_status
    from vllm.model_executor.layers.f32_gemm import CppGemm, kernel_matches_torch
    kernel = f32_gemm_kernel()
    if kernel is None:
        logger.warning("float32 projections: oneDNN; the C++ GEMM is %s",
                       kernel_status("f32_gemm"))
        return None
    gemm = CppGemm(kernel)
    if not kernel_matches_torch(gemm):
        logger.warning("float32 projections: oneDNN; the C++ GEMM differs from F.linear")
        return None
    return gemm


class CpuPlatform(Platform):
    device_type = "cpu"

    def __init__(self, device: str) -> None:
        super().__init__(device)
        self._norm_logged: set[torch.dtype] = set()

    def default_dtype(self, checkpoint_dtype: Optional[torch.dtype]) -> torch.dtype:
        return torch.float32  # bfloat16/float16 GEMMs are slower than float32 on most CPUs

    def _prepare(self, dtype: torch.dtype) -> None:
        from vllm._kernels.cpu_kernels import library
        library()  # logged once: loaded, or one WARNING (the torch paths, how to rebuild)
        cpu_malloc.tune_malloc()
        if cpu_malloc.huge_page_buffers():
            logger.info("CPU allocator: buffers of 2 MiB and more page-aligned on transparent "
                        "huge pages (THP_MEM_ALLOC_ENABLE=1; 0 turns it off).")
        else:
            logger.info("CPU allocator: torch's huge-page buffers are off (THP_MEM_ALLOC_ENABLE "
                        "is 0, or torch was imported before vllm).")
        impl = self.linear_impl(dtype)
        onednn = impl == "onednn"
        logger.info("Linear layers: %s", {
            "cpp": "C++ float32 GEMM with fused activation/residual/LayerNorm epilogues "
                   f"(VLLM_CPU_F32_GEMM={envs.VLLM_CPU_F32_GEMM}; onednn turns it off)",
            "onednn": "oneDNN GEMM with fused activation/residual epilogues "
                      "(VLLM_CPU_ONEDNN_LINEAR=0 turns it off)"}.get(impl, "F.linear"))
        if onednn:
            caps = {name: envs.get(name) or "unset, 1024" for name in SHAPE_CACHE_ENVS}
            logger.info("oneDNN per-shape caches bounded so memory levels off: %s",
                        ", ".join(f"{k}={v}" for k, v in caps.items()))

    def serving_policy(self) -> ServingPolicy:
        return ServingPolicy(share_heap=True, arrival_window=True, tokenize_between_steps=True)

    def prepare_server(self) -> None:
        cpu_malloc.share_heap_across_threads()

    def on_idle(self) -> Optional[IdleTask]:
        return cpu_malloc.HeapTrimmer.create()  # free heap pages back to the OS when idle

    def kv_cache_bytes(self, cache_config, profile: Callable[[], None]) -> int:
        if cache_config.cpu_kvcache_space_bytes is not None:
            return int(cache_config.cpu_kvcache_space_bytes)
        return int(envs.VLLM_CPU_KVCACHE_SPACE * GiB)

    def backend_preference(self, dtype: torch.dtype) -> tuple[str, ...]:
        """CPU_NATIVE first (the AVX-512 or AVX2 build of csrc/, whichever the install made:
        1.47x faster end to end than TORCH_SDPA on MiniLM on an AVX2 EPYC,
        benchmarks/README.md). Like any engine's batched kernels, an answer may differ by a
        few float32 ulps with the batch it ran in (~1.4e-6 on a normalised embedding)."""
        return ("CPU_NATIVE", "TORCH_SDPA")

    def backend_unavailable(self, name: str, dtype: torch.dtype,
                            head_dims: Sequence[int]) -> Optional[str]:
        if name == "TORCH_SDPA":
            return None
        if name == "TRITON_ATTN":
            if not envs.TRITON_INTERPRET:
                return ("its Triton kernels need a GPU; on the CPU they run only in Triton's "
                        "interpreter (TRITON_INTERPRET=1, slow: for tests)")
            return triton_attn_unavailable(dtype, head_dims)
        if name != "CPU_NATIVE":
            return super().backend_unavailable(name, dtype, head_dims)
        from vllm._kernels.cpu_kernels import kernel_status, varlen_attention_kernel
        if dtype not in KERNEL_DTYPES:
            return f"it runs float32 and bfloat16, not {str(dtype).replace('torch.', '')}"
        bad = sorted({d for d in head_dims if d % 16 or d > 256})
        if bad:
            return f"head size {bad[0]} is not a multiple of 16 up to 256"
        if varlen_attention_kernel() is None:
            return f"its C++ kernel is {kernel_status('varlen_attention')}"
        return None

    def linear_impl(self, dtype: torch.dtype) -> str:
        """"cpp" for float32 where `cpp_f32_gemm` gives the C++ GEMM; else "onednn" where
        oneDNN passes its self-check; "torch" for the rest and under
        VLLM_CPU_ONEDNN_LINEAR=0 (F.linear everywhere)."""
        from vllm.model_executor.layers.linear import onednn_linear_ok
        if not envs.VLLM_CPU_ONEDNN_LINEAR:
            return "torch"
        if dtype == torch.float32 and self.cpp_f32_gemm() is not None:
            return "cpp"
        return "onednn" if onednn_linear_ok(dtype) else "torch"

    def linear_gemm(self, dtype: torch.dtype):
        return self.cpp_f32_gemm() if self.linear_impl(dtype) == "cpp" else \
            super().linear_gemm(dtype)

    def cpp_f32_gemm(self):
        """The C++ float32 GEMM (layers.f32_gemm) where VLLM_CPU_F32_GEMM asks for it: "cpp",
        or "auto" with an AVX2 build of the kernels (oneDNN's AVX2 GEMM ran at 82% of the
        FMA peak in the engine, this one at ~90%; on AVX-512 oneDNN's runs at ~97%) and
        where it is built and matches torch; else None. Raises ValueError for an unknown
        choice."""
        from vllm._kernels.cpu_kernels import kernel_isa
        choice = envs.VLLM_CPU_F32_GEMM
        if choice not in F32_GEMM_CHOICES:
            raise ValueError(f"VLLM_CPU_F32_GEMM={choice!r}: use one of "
                             f"{', '.join(F32_GEMM_CHOICES)}")
        if choice == "onednn" or (choice == "auto" and kernel_isa() != "avx2"):
            return None
        return _cpp_f32_gemm()

    def check_quantization(self, method: str) -> None:
        """int8 runs where the CPU has int8 dot products (VNNI or AMX-INT8: oneDNN's GEMM)
        or AVX2 (the C++ kernel); elsewhere it is refused rather than run slower than
        float32 (`int8_linear.choose_path` raises, saying why)."""
        self.int8_path()

    def int8_path(self) -> tuple[str, str]:
        """(path, why) `quantization="int8"` runs on here: "AMX_FUSED", "AMX", "VNNI",
        "VNNI_FUSED" or "AVX2" (`int8_linear.choose_path`; VLLM_CPU_INT8_PATH forces one).
        Raises ValueError."""
        from vllm._kernels.cpu_kernels import (cpu_flags, int8_gemm_amx_kernel,
                                               int8_gemm_avx2_kernel, int8_gemm_vnni_kernel,
                                               kernel_status)
        from vllm.model_executor.layers.int8_linear import choose_path, int8_gemm_exact

        def missing(kernel: Callable, name: str) -> Callable[[], Optional[str]]:
            return lambda: None if kernel() is not None else kernel_status(name)
        return choose_path(cpu_flags(), envs.VLLM_CPU_INT8_PATH, int8_gemm_exact,
                           missing(int8_gemm_avx2_kernel, "int8_gemm_avx2"),
                           missing(int8_gemm_vnni_kernel, "int8_gemm_vnni"),
                           missing(int8_gemm_amx_kernel, "int8_gemm_amx"))

    def int8_gemm(self):
        """The int8 GEMM of the path `int8_path` chooses, logged in one INFO line."""
        from vllm._kernels.cpu_kernels import int8_gemm_amx_kernel, int8_gemm_avx2_kernel, \
            int8_gemm_vnni_kernel, int8_kernels, int8_layer_norm_kernel, kernel_status
        from vllm.model_executor.layers.int8_linear import AmxInt8Gemm, Avx2Int8Gemm, \
            Int8Gemm, VnniInt8Gemm
        path, why = self.int8_path()
        kernels = int8_kernels()
        logger.info("int8 projections: %s path (%s), per-token quantization %s", path, why,
                    "in C++" if kernels else f"in torch ops (C++ kernel "
                    f"{kernel_status('int8')})")
        if path == "AVX2":
            gemm = Avx2Int8Gemm(kernels, int8_gemm_avx2_kernel())
        elif path == "VNNI_FUSED":
            gemm = VnniInt8Gemm(kernels, int8_gemm_vnni_kernel())
        elif path == "AMX_FUSED":
            gemm = AmxInt8Gemm(kernels, int8_gemm_amx_kernel())
        else:
            gemm = Int8Gemm(kernels, path)
        gemm.layer_norm = int8_layer_norm_kernel()  # post-LN blocks: every path the same
        return gemm

    def int8_bf16_attention(self, backend: str) -> bool:
        """int8 models on CPU_NATIVE run attention on the bfloat16 kernel where the CPU has
        AVX512-BF16 (VLLM_CPU_INT8_BF16_ATTENTION=0 keeps float32): q, k, v and the softmax
        weights rounded to bf16 (relative 2^-9), float32 softmax and sums, float32 out. On
        MiniLM int8 (Zen 4): 1.06x end to end; min cosine to float32 0.9950 -> 0.9947,
        Spearman unchanged (benchmarks/README.md, session 20): well inside what the int8
        projections already cost. Logged once."""
        from vllm._kernels.cpu_kernels import kernel_status, varlen_attention_bf16_kernel
        on = backend == "CPU_NATIVE" and envs.VLLM_CPU_INT8_BF16_ATTENTION and \
            varlen_attention_bf16_kernel() is not None
        why = "VLLM_CPU_INT8_BF16_ATTENTION=0" if not envs.VLLM_CPU_INT8_BF16_ATTENTION else \
            f"backend {backend}" if backend != "CPU_NATIVE" else \
            f"the kernel is {kernel_status('varlen_attention_bf16')}"
        logger.info("int8 attention: %s", "bfloat16 q/k/v and weights on the AVX512-BF16 "
                    "kernel, float32 softmax and sums (VLLM_CPU_INT8_BF16_ATTENTION=0 keeps "
                    "float32)" if on else f"float32 ({why})")
        return on

    def skinny_gemm(self, dtype: torch.dtype) -> Optional[Callable]:
        """float32 on oneDNN: the C++ few-row kernel over oneDNN's packed weights, where it
        is built and matches F.linear (checked and logged once); on the C++ GEMM, the same
        kernel over that GEMM's packed weights (the layout it reads)."""
        if dtype != torch.float32 or not envs.VLLM_CPU_SKINNY_GEMM:
            return None
        from vllm.model_executor.layers import f32_gemm, skinny_gemm
        factory = {"cpp": f32_gemm.skinny_weight, "onednn": skinny_gemm.skinny_weight}.get(
            self.linear_impl(dtype))
        kernel = None if factory is None else _skinny_kernel()
        return None if kernel is None else functools.partial(factory, kernel)

    def rms_norm_kernel(self, dtype: torch.dtype) -> Optional[Callable]:
        """The C++ one-pass kernel (float32, bfloat16), built or loaded now (logged once)."""
        from vllm._kernels.cpu_kernels import kernel_status, rms_norm_kernel
        if dtype not in KERNEL_DTYPES:
            return None
        kernel = rms_norm_kernel()
        if dtype not in self._norm_logged:
            self._norm_logged.add(dtype)
            logger.info("RMSNorm: %s %s", "C++ one-pass kernel," if kernel is not None else
                        "torch ops; C++ kernel", kernel_status("rms_norm"))
        return kernel
