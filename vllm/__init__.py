"""A vLLM-compatible inference engine for pooling models.

The public names are imported on first use, so `import vllm` alone loads neither torch nor
transformers: process-wide environment that torch reads once (`vllm.platforms.process`:
huge-page buffers; the `vllm serve` command: OpenMP) is set before torch loads.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from vllm.platforms.process import bound_shape_caches, prefer_huge_pages
from vllm.transformers_utils import import_cache
from vllm.version import __version__

_EXPORTS = {
    "LLM": "vllm.entrypoints.llm",
    "EngineArgs": "vllm.engine.arg_utils",
    "PoolingParams": "vllm.pooling_params",
    **{name: "vllm.outputs" for name in (
        "PoolingOutput", "PoolingRequestOutput", "EmbeddingOutput", "EmbeddingRequestOutput",
        "ClassificationOutput", "ClassificationRequestOutput", "ScoringOutput",
        "ScoringRequestOutput")},
}

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.llm import LLM
    from vllm.outputs import (ClassificationOutput, ClassificationRequestOutput,
                              EmbeddingOutput, EmbeddingRequestOutput, PoolingOutput,
                              PoolingRequestOutput, ScoringOutput, ScoringRequestOutput)
    from vllm.pooling_params import PoolingParams

prefer_huge_pages()  # first: before anything loads torch
bound_shape_caches()
import_cache.install()  # before transformers loads: its import table is read once


def __getattr__(name: str) -> Any:
    """A public name (imported now), or a subpackage such as `vllm.config`."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    else:
        try:
            value = importlib.import_module(f"vllm.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"vllm.{name}":
                raise
            raise AttributeError(f"module 'vllm' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
