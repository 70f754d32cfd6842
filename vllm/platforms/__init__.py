"""The platform layer: every device decision, made once at start-up and logged.

`platform_for(device)` returns the `Platform` of a device name ("cpu", "cuda", "cuda:1");
`current_platform` is the one `device="auto"` picks (CUDA when torch sees a GPU, else CPU).
The process settings that must precede torch (`process`) are importable without torch, and
so is this package: torch loads only when a platform is asked for.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.platforms.interface import Platform

__all__ = ["platform_for", "resolve_device", "current_platform"]


def resolve_device(device: str) -> str:
    """`auto` is CUDA when torch sees a GPU, else CPU; any other name is kept."""
    if device == "auto":
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@functools.lru_cache(maxsize=None)
def platform_for(device: str = "auto") -> "Platform":
    """The platform object for a device name (one per name and process)."""
    device = resolve_device(device)
    kind = device.split(":", 1)[0]
    if kind == "cpu":
        from vllm.platforms.cpu import CpuPlatform
        return CpuPlatform(device)
    if kind == "cuda":
        from vllm.platforms.cuda import CudaPlatform
        return CudaPlatform(device)
    raise ValueError(f"device={device!r} is not supported; use auto, cpu or cuda[:N].")


def __getattr__(name: str) -> Any:
    if name == "current_platform":
        return platform_for("auto")
    raise AttributeError(f"module 'vllm.platforms' has no attribute {name!r}")
