"""What an embedding request asks of its output beyond the vectors, checked and applied once
for both fronts (`LLM.embed` and POST /v1/embeddings): `precision` with its `ranges`
(sentence-transformers' quantized types, vllm.entrypoints.quantize) and `sparse` (SPLADE's
{token_id: weight}). The server adds only what is its own (encoding_format, embed_dtype)
and maps an `OptionError` to a 400 naming its `param`; `LLM` raises it (a ValueError).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from vllm.config.model import ModelConfig
from vllm.entrypoints.quantize import check_precision, load_calibration, quantize
from vllm.entrypoints.sparse import check_sparse

CALIBRATED = ("int8", "uint8")  # the precisions that need per-dimension ranges


class OptionError(ValueError):
    """A bad output option; `param` names the request field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class Calibration:
    """The engine's `embedding_calibration` ranges, read from its file on first need."""

    def __init__(self, path: Optional[str]) -> None:
        self.path = path
        self._ranges: Any = None

    def ranges(self, precision: str) -> Any:
        if precision not in CALIBRATED or not self.path:
            return None
        if self._ranges is None:
            self._ranges = load_calibration(self.path)
        return self._ranges


@dataclass(frozen=True)
class EmbedOptions:
    precision: str = "float32"
    ranges: Any = None
    sparse: bool = False

    @classmethod
    def of(cls, precision: Optional[str], ranges: Any = None,
           sparse: Optional[bool] = False) -> "EmbedOptions":
        """The options of one request, each checked on its own (OptionError)."""
        try:
            precision = check_precision(precision)
        except ValueError as exc:
            raise OptionError(str(exc), "precision") from None
        if ranges is not None and precision not in CALIBRATED:
            raise OptionError("ranges apply to precision int8 and uint8 only.", "ranges")
        return cls(precision, ranges, bool(sparse))

    def check(self, model_config: ModelConfig) -> None:
        """What the model must offer: sparse output exists for SPLADE models only, and is
        float weights (no precision)."""
        if not self.sparse:
            return
        try:
            check_sparse(model_config)
        except ValueError as exc:
            raise OptionError(str(exc), "sparse") from None
        if self.precision != "float32":
            raise OptionError("sparse embeddings are float weights; leave precision unset "
                              "with sparse.", "precision")

    def quantize(self, values: list, calibration: Calibration) -> list:
        """`values` (float vectors) in `precision`: numpy arrays of its storage type, or
        the values as they are for float32."""
        if self.precision == "float32":
            return values
        ranges = self.ranges if self.ranges is not None else \
            calibration.ranges(self.precision)
        try:
            return [quantize(v, self.precision, ranges) for v in values]
        except ValueError as exc:
            raise OptionError(str(exc), "ranges" if self.ranges is not None
                              else "precision") from None
