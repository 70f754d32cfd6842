"""A vLLM-compatible inference engine for pooling models.

The public names are imported on first use, so `import vllm` alone loads neither torch nor
transformers: the `vllm` command sets process-wide environment (OpenMP) before torch loads.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'vllm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
