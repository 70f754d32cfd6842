"""PoolerConfig: how a model turns hidden states into its answer.

A plain dataclass (no pydantic: the engine and `LLM` run where only the server's
dependencies are missing); `pooling_type` is checked and upper-cased on every assignment.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from vllm.tasks import ENGINE_TASKS

POOLING_TYPES = ("LAST", "CLS", "MEAN", "ALL", "STEP", "SPLADE")
# Upstream's engine-level pooling tasks (`PoolerConfig(task=...)`): the table's, BGE-M3's
# pair and upstream's IOProcessor plugins.
TASKS = (*ENGINE_TASKS, "embed&token_classify", "plugin")
_REMOVED_TASKS = {"score": "`score` task was removed; use `classify` instead.",
                  "encode": "`encode` task was removed; use `token_embed` or "
                            "`token_classify` instead."}


def _pooling_type(v: Any) -> Optional[str]:
    if v is None:
        return v
    if hasattr(v, "name"):
        v = v.name
    v = str(v).upper()
    if v not in POOLING_TYPES:
        raise ValueError(f"pooling_type must be one of {POOLING_TYPES}, got {v!r}")
    return v


def _task(v: Any) -> Optional[str]:
    if v is None:
        return v
    if v in _REMOVED_TASKS:
        raise ValueError(_REMOVED_TASKS[v])
    if v not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {v!r}")
    return v


@dataclass(repr=False)
class PoolerConfig:
    """Resolved once at start-up; request-level `PoolingParams` fall back to it."""

    pooling_type: Optional[str] = None
    # The one pooling task this engine runs (upstream 0.32); None: chosen from the model.
    task: Optional[str] = None
    normalize: Optional[bool] = None
    dimensions: Optional[int] = None
    activation: Optional[bool] = None
    softmax: Optional[bool] = None
    step_tag_id: Optional[int] = None
    returned_token_ids: Optional[list[int]] = None
    # Embeddings longer than max_model_len: split into chunks, token-weighted mean (upstream)
    enable_chunked_processing: Optional[bool] = None
    max_embed_len: Optional[int] = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "pooling_type":
            value = _pooling_type(value)
        elif name == "task":
            value = _task(value)
        super().__setattr__(name, value)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "PoolerConfig":
        """From a user's dict (`--override-pooler-config`); unknown keys are a ValueError."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Unknown pooler config field(s) {unknown}; known: "
                             f"{sorted(known)}.")
        return cls(**values)

    def model_copy(self) -> "PoolerConfig":
        return dataclasses.replace(self)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}"
                           for f in dataclasses.fields(self))
        return f"PoolerConfig({fields})"

    __str__ = __repr__
