"""Quantized embeddings with sentence-transformers' names and arithmetic.

`precision` is one of float32, int8, uint8, binary, ubinary, as
`sentence_transformers.quantization.quantize_embeddings`:
- binary/ubinary keep the sign bit of each value (> 0), packed 8 per byte, most
  significant bit first; binary stores each byte minus 128 as int8;
- int8/uint8 cut each dimension's calibration range [min, max] into 255 steps and keep
  the step index (int8: minus 128). The ranges come from the request or from the
  server's calibration file; without them the request is refused (ValueError), rather
  than calibrating on the request's own few embeddings.
Shared by `LLM.embed` and the HTTP server.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
# The numpy storage type of each precision's values.
STORAGE_DTYPES = {"float32": np.float32, "int8": np.int8, "uint8": np.uint8,
                  "binary": np.int8, "ubinary": np.uint8}


def check_precision(precision: Optional[str]) -> str:
    precision = precision or "float32"
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got "
                         f"{precision!r}.")
    return precision


def as_ranges(value: Any, dim: Optional[int] = None) -> np.ndarray:
    """A (2, dim) float32 array of per-dimension [min] and [max] rows, checked."""
    try:
        ranges = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ValueError("ranges must be two lists of numbers: [[min per dimension], "
                         "[max per dimension]].") from exc
    if ranges.ndim != 2 or ranges.shape[0] != 2:
        raise ValueError("ranges must be two lists of numbers: [[min per dimension], "
                         f"[max per dimension]]; got an array of shape {ranges.shape}.")
    if dim is not None and ranges.shape[1] != dim:
        raise ValueError(f"ranges cover {ranges.shape[1]} dimensions but the embeddings "
                         f"have {dim}.")
    return ranges


def load_calibration(path: str) -> np.ndarray:
    """Ranges from a calibration file: `.npy` holding calibration embeddings (N, dim)
    whose per-dimension min/max become the ranges (as sentence-transformers'
    `calibration_embeddings`), or JSON `{"ranges": [[mins], [maxs]]}` /
    `{"calibration_embeddings": [[...], ...]}`."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"embedding calibration file {path!r} does not exist.")
    if file.suffix == ".npy":
        return _ranges_of(np.load(file))
    data = json.loads(file.read_text())
    if isinstance(data, dict) and "ranges" in data:
        return as_ranges(data["ranges"])
    if isinstance(data, dict) and "calibration_embeddings" in data:
        return _ranges_of(np.asarray(data["calibration_embeddings"], dtype=np.float32))
    raise ValueError(f"embedding calibration file {path!r} must be a .npy array of "
                     "calibration embeddings or JSON with 'ranges' or "
                     "'calibration_embeddings'.")


def _ranges_of(embeddings: np.ndarray) -> np.ndarray:
    if embeddings.ndim != 2 or embeddings.shape[0] < 2:
        raise ValueError("calibration embeddings must be a 2-D array with at least two rows.")
    return np.stack([embeddings.min(axis=0), embeddings.max(axis=0)]).astype(np.float32)


def quantize(vector: torch.Tensor, precision: str,
             ranges: Optional[np.ndarray] = None) -> np.ndarray:
    """One float embedding as `precision` values (a 1-D numpy array of its storage type)."""
    emb = vector.detach().to(torch.float32).reshape(-1).numpy()
    if precision == "float32":
        return emb
    if precision in ("binary", "ubinary"):
        packed = np.packbits(emb > 0)
        return (packed - 128).astype(np.int8) if precision == "binary" else packed
    if ranges is None:
        raise ValueError(f"precision {precision!r} needs calibration ranges: pass `ranges` "
                         "([[min per dimension], [max per dimension]]) or start the server "
                         "with --embedding-calibration FILE.")
    ranges = as_ranges(ranges, emb.shape[0])
    starts = ranges[0]
    steps = (ranges[1] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    buckets = np.clip(np.floor((emb - starts) / steps), 0, 255)
    return buckets.astype(np.uint8) if precision == "uint8" else (buckets - 128).astype(np.int8)
