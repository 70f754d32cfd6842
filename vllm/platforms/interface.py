"""`Platform`: what a device decides once, at start-up, each decision logged in one line.

A platform answers: the default dtype for `dtype="auto"`; the process settings its engine
wants (allocator, threads); how many bytes the KV cache may take; which attention backend
runs (`VLLM_ATTENTION_BACKEND` forces one) and which op implementations (GEMM epilogues,
RMSNorm kernel) the model's layers bind to; and which serving policies the server uses.
Models, the runner and the server ask it; none of them tests the device itself.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional, Protocol, Sequence

import torch

from vllm import envs
from vllm.attention.backends.registry import BACKEND_NAMES, check_backend_name
from vllm.logger import init_logger

logger = init_logger(__name__)

GiB = 1 << 30


TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def triton_attn_unavailable(dtype: torch.dtype, head_dims: Sequence[int]) -> Optional[str]:
    """Why TRITON_ATTN's kernels cannot run this model on any device (None: they can)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if dtype not in TRITON_DTYPES:
        return f"it runs float32, float16 and bfloat16, not {str(dtype).replace('torch.', '')}"
    bad = sorted({d for d in head_dims if d > 256})
    if bad:
        return f"head size {bad[0]} is above 256"
    return None


@dataclass(frozen=True)
class ServingPolicy:
    """How the server's engine loop shares the machine with HTTP work and tokenization."""

    share_heap: bool              # one glibc heap for every thread (engine on its own thread)
    arrival_window: bool          # a drained engine waits a few ms for the next step's requests
    tokenize_between_steps: bool  # texts tokenized by the engine loop between steps (True),
    #                               or on the tokenizer thread while a step runs (False)


class IdleTask(Protocol):
    """Housekeeping the server's engine thread runs when it has had nothing to do."""

    def delay(self) -> float:
        """Seconds of idleness (from now, after steps) before the task should run."""

    def __call__(self) -> None: ...


class Platform:
    device_type: ClassVar[str]

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self._prepared: set[torch.dtype] = set()

    # ----- dtype ------------------------------------------------------------------------
    def default_dtype(self, checkpoint_dtype: Optional[torch.dtype]) -> torch.dtype:
        """The dtype `dtype="auto"` runs in, given the checkpoint's (None: not stated)."""
        raise NotImplementedError

    def check_quantization(self, method: str) -> None:
        """Raise ValueError, saying why, where this device cannot run `method`."""
        raise ValueError(f"quantization={method!r} runs on the CPU only (this device: "
                         f"{self.device_type}).")

    def int8_gemm(self):
        """The GEMM for `quantization="int8"` projections (after `check_quantization`)."""
        raise NotImplementedError

    def int8_bf16_attention(self, backend: str) -> bool:
        """Whether an int8 model's attention on `backend` runs on bfloat16 q/k/v (and P)."""
        return False

    # ----- process ----------------------------------------------------------------------
    def prepare(self, dtype: torch.dtype) -> None:
        """Once per process and dtype, before the model is built: process settings and the
        op choices, logged."""
        if dtype not in self._prepared:
            self._prepared.add(dtype)
            self._prepare(dtype)

    def _prepare(self, dtype: torch.dtype) -> None:
        pass

    def serving_policy(self) -> ServingPolicy:
        raise NotImplementedError

    def prepare_server(self) -> None:
        """Before the server's engine thread starts (process-wide settings)."""

    def on_idle(self) -> Optional[IdleTask]:
        """What the server's engine thread runs once it has been idle for the task's
        `delay()` after steps that finished requests (None: nothing)."""
        return None

    # ----- KV cache ---------------------------------------------------------------------
    def kv_cache_bytes(self, cache_config, profile: Callable[[], None]) -> int:
        """Bytes the KV cache may take. `profile()` runs the largest step the scheduler can
        make without a cache, and the platform reads the peak bytes allocated on the device
        around it (weights included); platforms that size the cache from a fixed budget
        never call it."""
        raise NotImplementedError

    # ----- attention backend ------------------------------------------------------------
    def attention_backend(self, dtype: torch.dtype, head_dims: Sequence[int],
                          cache_readers: bool = False) -> str:
        """The backend name for a model whose attention layers have `head_dims`:
        VLLM_ATTENTION_BACKEND when set (ValueError if unknown or unusable here), else the
        platform's first choice that can run it (`default_backends`; `cache_readers`: its
        steps can hold requests reading cached keys). Logged."""
        forced = envs.VLLM_ATTENTION_BACKEND
        if forced is not None:
            check_backend_name(forced)
            why_not = self.backend_unavailable(forced, dtype, head_dims)
            if why_not is not None:
                raise ValueError(f"VLLM_ATTENTION_BACKEND={forced} cannot run here: {why_not}. "
                                 f"Unset it, or choose another of {', '.join(BACKEND_NAMES)}.")
            logger.info("Attention backend: %s (VLLM_ATTENTION_BACKEND).", forced)
            return forced
        skipped = []
        order, why = self.default_backends(dtype, cache_readers)
        for name in order:
            why_not = self.backend_unavailable(name, dtype, head_dims)
            if why_not is None:
                note = f" ({why})" if why and not skipped else ""
                logger.info("Attention backend: %s%s%s.", name, note,
                            "".join(f"; {s}" for s in skipped))
                return name
            skipped.append(f"not {name}: {why_not}")
        raise ValueError(f"No attention backend can run here ({'; '.join(skipped)}).")

    def backend_preference(self, dtype: torch.dtype) -> tuple[str, ...]:
        """Backend names in the order this platform prefers them."""
        raise NotImplementedError

    def default_backends(self, dtype: torch.dtype,
                         cache_readers: bool) -> tuple[tuple[str, ...], str]:
        """(backend names in the order preferred for this model, why; "" for nothing to
        say): `backend_preference` unless a platform weighs `cache_readers`."""
        return self.backend_preference(dtype), ""

    def backend_unavailable(self, name: str, dtype: torch.dtype,
                            head_dims: Sequence[int]) -> Optional[str]:
        """Why backend `name` cannot run a model of this dtype and head sizes here (None:
        it can)."""
        return f"{name} is not a {self.device_type} backend"

    # ----- ops ----------------------------------------------------------------------------
    def linear_impl(self, dtype: torch.dtype) -> str:
        """'cpp', 'onednn' or 'torch': the GEMM implementation Linear layers bind to."""
        return "torch"

    def linear_gemm(self, dtype: torch.dtype):
        """The `layers.linear` GEMM object of `linear_impl`."""
        from vllm.model_executor.layers.linear import GEMMS
        return GEMMS[self.linear_impl(dtype)]

    def rms_norm_kernel(self, dtype: torch.dtype) -> Optional[Callable]:
        """A fused RMSNorm `f(x, weight, eps)` for this dtype, or None (torch ops)."""
        return None

    def skinny_gemm(self, dtype: torch.dtype) -> Optional[Callable]:
        """`f(packed weight, n, k)` -> a few-row projection over a packed weight (see
        layers.skinny_gemm), or None where every row count uses `linear_impl`."""
        return None

    def synchronize(self) -> None:
        """Wait for queued device work (for timing)."""
