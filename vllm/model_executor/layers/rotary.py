"""Rotary position embeddings (rotate-half layout, as Llama/Qwen checkpoints use)."""
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


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_positions: int, params: dict) -> None:
        super().__init__()
        self.head_dim = head_dim
        inv = _inv_freq(head_dim, params)
        t = torch.arange(max_positions, dtype=torch.float64)
        freqs = torch.outer(t, inv)
        self.register_buffer("cos", freqs.cos().float(), persistent=False)
        self.register_buffer("sin", freqs.sin().float(), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        """[T, 1, D/2] cos and sin of each position, computed once per forward."""
        return (self.cos[positions].to(dtype)[:, None, :],
                self.sin[positions].to(dtype)[:, None, :])


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate [T, heads, D] in the rotate-half layout."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
