"""Every environment variable the engine reads: name, default and what it does, in one place.

`vllm.envs.VLLM_CPU_KVCACHE_SPACE` reads the variable at that moment (no caching), so a
test or a launcher that sets it later is honoured. `is_set(name)` says whether the user set
one at all. Only this module and `vllm.platforms` (which sets process variables before torch
loads) touch `os.environ`; tests/test_envs.py checks that. The README's table points here.
"""
from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple, Optional


def _flag(value: str) -> bool:
    return value.strip().lower() not in ("0", "", "false", "no", "off")


def _gib(value: str) -> float:
    return float(value) if value.strip() else 4.0


def _upper(value: str) -> Optional[str]:
    return value.strip().upper() or None


class EnvVar(NamedTuple):
    default: Optional[str]       # as it would be spelled in the environment (None: unset)
    parse: Callable[[str], Any]
    doc: str


def _str(value: str) -> str:
    return value


environment_variables: dict[str, EnvVar] = {
    # ----- engine --------------------------------------------------------------------
    "VLLM_ATTENTION_BACKEND": EnvVar(None, _upper, "Force the attention backend: CPU_NATIVE, "
                                     "TORCH_SDPA, FLASH_ATTN or TRITON_ATTN (default: the "
                                     "platform's choice)."),
    "VLLM_CPU_KVCACHE_SPACE": EnvVar("4", _gib, "KV cache size on CPU, in GiB (default 4)."),
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": EnvVar("0", _flag, "Allow max_model_len above the derived "
                                            "limit, up to the model's position limit."),
    "VLLM_API_KEY": EnvVar(None, _str, "Default for `vllm serve --api-key`."),
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": EnvVar("0", _flag, "1/True: `vllm serve` adds "
                                               "POST /v1/load_lora_adapter and "
                                               "/v1/unload_lora_adapter (upstream's names)."),
    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": EnvVar("5", int, "Seconds an idle keep-alive HTTP "
                                           "connection stays open (uvicorn's "
                                           "timeout_keep_alive, as upstream); default for "
                                           "`vllm serve --timeout-keep-alive`."),
    "VLLM_SERVER_DIRECT_ROUTES": EnvVar("1", _flag, "0: every pooling request goes through "
                                        "FastAPI's router, none by the direct path "
                                        "(entrypoints/openai/direct_routes.py)."),
    "VLLM_CONFIGURE_LOGGING": EnvVar("1", _flag, "0: leave the `vllm` logger unconfigured."),
    "VLLM_LOGGING_LEVEL": EnvVar("INFO", lambda v: v.strip().upper() or "INFO",
                                 "Level of the `vllm` logger."),
    # ----- images (vllm/multimodal) ----------------------------------------------------
    "VLLM_IMAGE_FETCH_TIMEOUT": EnvVar("5", float, "Seconds to fetch one image over http(s) "
                                       "(only from --allowed-media-domains hosts)."),
    "VLLM_MEDIA_MAX_BYTES": EnvVar(str(20 * 2**20), int, "Largest encoded image accepted, in "
                                   "bytes (data: URL, local file or fetch; default 20 MiB)."),
    "VLLM_MAX_IMAGE_PIXELS": EnvVar(str(64 * 2**20), int, "Largest width x height an image "
                                    "may declare; checked before decoding (default 64 Mi)."),
    # ----- CPU platform ----------------------------------------------------------------
    "VLLM_CPU_KERNELS": EnvVar("1", _flag, "0: never use the C++ kernels in csrc/."),
    "VLLM_CPU_KERNELS_JIT": EnvVar("0", _flag, "1 (developers): where the C++ kernels were "
                                   "not built at install, build them with CMake on first use."),
    "VLLM_CPU_KERNELS_LIB": EnvVar(None, _str, "A kernel library to load instead of the "
                                   "installed one (developers: e.g. an AVX2 build, CMake's "
                                   "-DVLLM_CPU_ARCH=x86-64-v3, tested on an AVX-512 CPU)."),
    "VLLM_CPU_ONEDNN_LINEAR": EnvVar("1", _flag, "0: CPU projections use F.linear, not oneDNN."),
    "VLLM_CPU_F32_GEMM": EnvVar("auto", lambda v: v.strip().lower() or "auto",
                                "float32 CPU projections: auto (the C++ GEMM where the kernels "
                                "are an AVX2 build, i.e. CPUs without AVX-512; else oneDNN), "
                                "cpp (the C++ GEMM on any SIMD build) or onednn."),
    "VLLM_CPU_SKINNY_GEMM": EnvVar("1", _flag, "0: float32 projections of at most 64 rows "
                                   "use oneDNN, not the C++ kernel that reads its packed weights."),
    "VLLM_CPU_INT8_PATH": EnvVar("auto", lambda v: v.strip().lower() or "auto",
                                 "quantization='int8' GEMM: auto (the C++ AMX kernel on "
                                 "AMX-INT8, the C++ VNNI kernel on AVX512-VNNI, oneDNN on "
                                 "AVX-VNNI, else the C++ AVX2 kernel), amx_fused / "
                                 "vnni_fused (force the AMX / VNNI kernel), avx2 "
                                 "(force the AVX2 kernel) or onednn (oneDNN only)."),
    "VLLM_CPU_INT8_BF16_ATTENTION": EnvVar("1", _flag, "0: quantization='int8' models keep "
                                           "float32 attention on CPUs with AVX512-BF16 "
                                           "(default: q, k, v and the softmax weights in "
                                           "bfloat16, float32 sums)."),
    "VLLM_CPU_MALLOC_TUNING": EnvVar("1", _flag, "0: leave glibc's malloc thresholds and "
                                     "arenas alone."),
    "XDG_CACHE_HOME": EnvVar(None, _str, "Where VLLM_CPU_KERNELS_JIT builds the C++ kernels "
                           "and --grpc-port generates TEI's gRPC stubs (default ~/.cache)."),
    # ----- read before torch loads (set by vllm.platforms where unset) --------------------
    "THP_MEM_ALLOC_ENABLE": EnvVar(None, _str, "torch: 1 = huge-page-aligned CPU buffers "
                                   "(vllm sets 1 where unset; 0 turns it off)."),
    "LRU_CACHE_CAPACITY": EnvVar(None, _str, "torch/ideep per-shape computation cache "
                                 "entries; vllm sets 64 where unset (torch: 1024)."),
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": EnvVar(None, _str, "oneDNN per-shape primitive cache "
                                              "entries; vllm sets 64 where unset (oneDNN: "
                                              "1024)."),
    "GOMP_SPINCOUNT": EnvVar(None, _str, "libgomp idle spin; `vllm serve` on CPU sets 10000 "
                             "where neither it nor OMP_WAIT_POLICY is set."),
    "OMP_NUM_THREADS": EnvVar(None, _str, "OpenMP threads; when set, data-parallel CPU "
                              "replicas keep it instead of sharing the cores out."),
    "OMP_WAIT_POLICY": EnvVar(None, _str, "OpenMP wait policy; when set, vllm leaves "
                              "GOMP_SPINCOUNT alone."),
    "TOKENIZERS_PARALLELISM": EnvVar(None, _flag, "Hugging Face tokenizers' thread pool; the "
                                     "CPU server sets false where unset."),
    "HF_HUB_OFFLINE": EnvVar("0", _flag, "1: never reach the Hugging Face Hub."),
    "TRITON_INTERPRET": EnvVar("0", _flag, "Triton's own variable: 1 runs @triton.jit "
                               "kernels on CPU tensors in its interpreter (slow: tests). "
                               "vllm reads it to allow TRITON_ATTN on the CPU."),
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": EnvVar("grpc", lambda v: v.strip().lower() or "grpc",
                                                 "OpenTelemetry's: how --otlp-traces-endpoint "
                                                 "exports spans, grpc (default) or "
                                                 "http/protobuf."),
    # ----- scale-out ---------------------------------------------------------------------
    "RAY_ADDRESS": EnvVar(None, _str, "Ray cluster for --data-parallel-backend ray when "
                          "--ray-address is not given (else a local cluster is started)."),
}


def is_set(name: str) -> bool:
    """Whether the variable `name` (one of `environment_variables`) is in the environment."""
    _known(name)
    return name in os.environ


def get(name: str) -> Any:
    """The parsed value of `name` now (its default's parse when unset; None: no default)."""
    var = _known(name)
    raw = os.environ.get(name, var.default)
    return None if raw is None else var.parse(raw)


def _known(name: str) -> EnvVar:
    try:
        return environment_variables[name]
    except KeyError:
        raise AttributeError(f"{name} is not an environment variable vllm reads (see "
                             "vllm/envs.py)") from None


def __getattr__(name: str) -> Any:
    return get(name)


def __dir__() -> list[str]:
    return sorted(environment_variables)
