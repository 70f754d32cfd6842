"""Upstream vLLM's output encodings for /v1/embeddings and /pooling.

- `encoding_format`: `float` (JSON numbers), `base64` (each item's bytes, base64 in the
  JSON body), `bytes` (an `application/octet-stream` body: the items' bytes back to back,
  described by a `metadata` header holding JSON `{"id", "created", "model", "data":
  [{"index", "embed_dtype", "endianness", "start", "end", "shape"}], "usage"}`) and
  `bytes_only` (the same body, no header).
- `embed_dtype`: float32, float16, bfloat16 (the raw 2-byte bfloat16 bit pattern),
  fp8_e4m3 or fp8_e5m2 (one byte per value: torch's float8_e4m3fn / float8_e5m2 bits).
- `endianness`: native (this machine's), big or little.
Quantized embeddings (`precision`, see `vllm.entrypoints.quantize`) are already integer
arrays: their bytes go out as they are and `embed_dtype` names their storage type.
"""
from __future__ import annotations

import base64
import json
import sys
from typing import Any, Union

import numpy as np
import torch
from fastapi.responses import Response

from vllm.entrypoints.quantize import STORAGE_DTYPES

EMBED_DTYPES = {"float32": (torch.float32, torch.float32),
                "float16": (torch.float16, torch.float16),
                # numpy has no bfloat16: its bits travel as 2-byte words
                "bfloat16": (torch.bfloat16, torch.int16),
                # one byte per value, upstream's fp8 encodings (torch's bit layouts)
                "fp8_e4m3": (torch.float8_e4m3fn, torch.uint8),
                "fp8_e5m2": (torch.float8_e5m2, torch.uint8)}
ENDIANNESS = ("native", "big", "little")
BYTE_FORMATS = ("bytes", "bytes_only")

Value = Union[torch.Tensor, np.ndarray]


def to_bytes(value: Value, embed_dtype: str = "float32", endianness: str = "native") -> bytes:
    """The flattened value in `embed_dtype` with the asked byte order (a quantized numpy
    array keeps its own one-byte type)."""
    if isinstance(value, np.ndarray):
        array = value.reshape(-1)
    else:
        dtype, view = EMBED_DTYPES[embed_dtype]
        array = value.detach().to(dtype).flatten().contiguous().view(view).numpy()
    if endianness != "native" and endianness != sys.byteorder:
        array = array.byteswap()
    return array.tobytes()


def to_json_value(value: Value, encoding_format: str, embed_dtype: str,
                  endianness: str) -> Union[list, str]:
    """One item's `embedding` / `data` field for the JSON formats."""
    if encoding_format == "base64":
        return base64.b64encode(to_bytes(value, embed_dtype, endianness)).decode("ascii")
    return value.tolist()


def item_dtype(value: Value, embed_dtype: str) -> str:
    if isinstance(value, np.ndarray):
        return next(n for n in ("int8", "uint8") if STORAGE_DTYPES[n] == value.dtype)
    return embed_dtype


def bytes_response(values: list[Value], *, response_id: str, created: int, model: str,
                   usage: dict[str, Any], encoding_format: str, embed_dtype: str,
                   endianness: str) -> Response:
    """The `bytes` / `bytes_only` answer: raw items back to back (+ `metadata` header)."""
    chunks, items, offset = [], [], 0
    for index, value in enumerate(values):
        chunk = to_bytes(value, embed_dtype, endianness)
        items.append({"index": index, "embed_dtype": item_dtype(value, embed_dtype),
                      "endianness": endianness, "start": offset, "end": offset + len(chunk),
                      "shape": list(value.shape)})
        chunks.append(chunk)
        offset += len(chunk)
    headers = None
    if encoding_format == "bytes":
        headers = {"metadata": json.dumps({
            "id": response_id, "created": created, "model": model, "data": items,
            "usage": {"prompt_tokens": usage["prompt_tokens"],
                      "total_tokens": usage["total_tokens"]}})}
    return Response(b"".join(chunks), headers=headers, media_type="application/octet-stream")
