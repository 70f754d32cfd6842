"""The int8 weight formats of `quantization="int8"` (layers/int8_linear.py): a weight per
output channel, symmetric, quantized once at load; and the packed layout the C++ kernels
(csrc/int8_gemm_avx2.cpp, int8_gemm_vnni.cpp, int8_gemm_amx.cpp) read in place."""
from __future__ import annotations

from typing import NamedTuple

import torch


class Int8Weight(NamedTuple):
    q: torch.Tensor      # [N, K] int8
    scale: torch.Tensor  # [N] float32


def quantize_weight(weight: torch.Tensor) -> Int8Weight:
    """Per output channel, symmetric: scale = max|W[n, :]| / 127 (a zero row keeps 0)."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127.0
    q = torch.round(w / scale.clamp_min(1e-30)[:, None]).clamp_(-127, 127).to(torch.int8)
    return Int8Weight(q.contiguous(), scale.contiguous())


class Avx2Weight(NamedTuple):
    """An int8 weight packed for a C++ kernel (`pack_avx2`: group 2 for the AVX2 kernel,
    4 for the AMX one)."""
    packed: torch.Tensor  # [ceil(N / 16), ceil(K / group), 16, group] int8
    scale: torch.Tensor   # [N] float32


class VnniWeight(NamedTuple):
    """An int8 weight in the VNNI kernel's layout (`pack_avx2`, group 4) and its
    compensation."""
    packed: torch.Tensor  # [ceil(N / 16), ceil(K / 4), 16, 4] int8
    comp: torch.Tensor    # [ceil(N / 16) * 16] int32: 128 * sum_k q[n, k] (0 past N)
    scale: torch.Tensor   # [N] float32


def column_compensation(q: torch.Tensor, block: int = 16) -> torch.Tensor:
    """128 * sum_k q[n, k] per output column, padded with 0 to whole blocks: what the VNNI
    kernel's u8 activations (a + 128) add to each column's sum, taken back out there."""
    n, k = q.shape
    if 128 * 127 * k >= 2 ** 31:
        raise ValueError(f"int8 weight of {k} inputs: its compensation overflows int32")
    comp = torch.zeros(-(-n // block) * block, dtype=torch.int32)
    comp[:n] = q.sum(dim=1, dtype=torch.int32) * 128
    return comp


def pack_avx2(q: torch.Tensor, block: int = 16, slack: int = 0,
              group: int = 4) -> torch.Tensor:
    """q [N, K] int8 in [-127, 127] as the C++ kernels read it: blocks of `block` output
    columns, each [ceil(K / group)][block][group] (`group` consecutive k of a column side
    by side: 4 for the VNNI and AMX kernels' dot products of 4, 2 for the AVX2 kernel's
    `vpmaddwd` pairs), columns past N and k past K zero. `slack`: zero bytes after it in
    its storage (the AMX kernel's last tile may read on past the end)."""
    n, k = q.shape
    n_pad, k_pad = -(-n // block) * block, -(-k // group) * group
    padded = torch.zeros((n_pad, k_pad), dtype=torch.int8)
    padded[:n, :k] = q
    packed = padded.view(n_pad // block, block, k_pad // group, group).permute(0, 2, 1, 3)
    storage = torch.zeros(packed.numel() + slack, dtype=torch.int8)
    storage[:packed.numel()].view(packed.shape).copy_(packed)
    return storage[:packed.numel()].view(packed.shape)
