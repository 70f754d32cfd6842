"""oneDNN's packed float32 weights: the copy its GEMMs take (`pack_weight`), and a view of
that copy's memory (`packed_buffer`) for the few-row kernel and its layout probe."""
from __future__ import annotations

import ctypes

import torch


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked copy of an [out, in] weight (an opaque mkldnn tensor that only the
    oneDNN GEMMs here accept). Its layout may depend on the calling thread's OpenMP thread
    count (see skinny_gemm)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def packed_buffer(packed: torch.Tensor) -> torch.Tensor:
    """A float32 view of an opaque oneDNN tensor's buffer, in memory order (valid while
    `packed` lives)."""
    nbytes = torch.ops.mkldnn._nbytes(packed)
    buf = (ctypes.c_float * (nbytes // 4)).from_address(torch.ops.mkldnn.data_ptr(packed))
    return torch.frombuffer(buf, dtype=torch.float32)
