"""PoolerConfig: how a model turns hidden states into its answer."""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, field_validator

POOLING_TYPES = ("LAST", "CLS", "MEAN", "ALL", "STEP", "SPLADE")


class PoolerConfig(BaseModel):
    """Resolved once at start-up; request-level `PoolingParams` fall back to it."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    pooling_type: Optional[str] = None
    normalize: Optional[bool] = None
    dimensions: Optional[int] = None
    activation: Optional[bool] = None
    softmax: Optional[bool] = None
    step_tag_id: Optional[int] = None
    returned_token_ids: Optional[list[int]] = None

    @field_validator("pooling_type", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        if v is None:
            return v
        if hasattr(v, "name"):
            v = v.name
        v = str(v).upper()
        if v not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {POOLING_TYPES}, got {v!r}")
        return v

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"PoolerConfig({fields})"

    __str__ = __repr__
