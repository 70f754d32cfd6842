"""Rotary position embeddings as one complex multiply per tensor.

Llama/Qwen checkpoints rotate pairs (x_i, x_{i+D/2}) of each head ("rotate-half"). The
loader reorders the query/key rows of every head (and the QK-norm weights) with
`interleave_halves`, so that pair sits side by side: the head is then D/2 complex numbers
and the rotation is `x * e^(i*theta)`, one pass over the tensor instead of the seven of
the rotate-half formula. Attention only ever takes dot products of queries with keys,
which a permutation applied to both leaves unchanged; values keep their order.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def rope_parameters(config) -> dict:
    """The rope settings of a HF config, across transformers 4 (`rope_theta`,
    `rope_scaling`) and 5 (`rope_parameters`) spellings."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    scaling = getattr(config, "rope_scaling", None) or {}
    for key, value in scaling.items():
        params.setdefault(key, value)
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params


def _inv_freq(head_dim: int, params: dict) -> torch.Tensor:
    base = float(params["rope_theta"])
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = params["rope_type"]
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(params["factor"])
    if kind == "llama3":
        factor = float(params["factor"])
        low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old_len = float(params["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope_type {kind!r} is not supported (supported: default, linear, llama3).")


def interleave_halves(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Reorder dim 0 of a [heads * head_dim, ...] tensor from rotate-half order
    (0, 1, .., D/2-1, D/2, .., D-1) to pairs (0, D/2, 1, D/2+1, ...) within every head."""
    rest = t.shape[1:]
    return t.reshape(-1, 2, head_dim // 2, *rest).transpose(1, 2).reshape(t.shape)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_positions: int, params: dict) -> None:
        super().__init__()
        self.head_dim = head_dim
        inv = _inv_freq(head_dim, params)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv)
        # complex64 whatever the model dtype: a plain attribute, so `model.to(dtype)` (which
        # would cast a complex buffer to real) leaves it alone; moved on first use.
        self._table = torch.polar(torch.ones_like(freqs), freqs).to(torch.complex64)

    def rotations(self, positions: torch.Tensor) -> torch.Tensor:
        """[T, 1, D/2] complex e^(i*theta) of each position, looked up once per forward."""
        if self._table.device != positions.device:
            self._table = self._table.to(positions.device)
        return self._table[positions][:, None, :]


def apply_rotary(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotate [T, heads, D] (pairs interleaved, see `interleave_halves`). Computed in
    float32 (complex64) for every dtype."""
    t, h, d = x.shape
    pairs = x.float().reshape(t, h, d // 2, 2)
    if pairs.stride(-1) != 1 or any(st % 2 for st in pairs.stride()[:-1]):
        pairs = pairs.contiguous()  # view_as_complex needs whole (re, im) pairs
    out = torch.view_as_real(torch.view_as_complex(pairs) * rotation)
    return out.reshape(t, h, d).to(x.dtype)
