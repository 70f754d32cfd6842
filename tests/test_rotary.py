"""Rotary as a complex multiply on interleaved pairs equals the rotate-half formula."""
from __future__ import annotations

import pytest
import torch

from vllm.model_executor.layers.rotary import RotaryEmbedding, apply_rotary, interleave_halves


def _rotate_half_reference(x: torch.Tensor, positions: torch.Tensor, theta: float):
    """Llama's formula in float64: x*cos + rotate_half(x)*sin, cos/sin repeated twice."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = torch.outer(positions.double(), inv)
    cos, sin = torch.cat([freqs.cos()] * 2, -1)[:, None], torch.cat([freqs.sin()] * 2, -1)[:, None]
    x = x.double()
    rotated = torch.cat((-x[..., d // 2:], x[..., : d // 2]), dim=-1)
    return x * cos + rotated * sin


def _deinterleave(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Inverse of `interleave_halves` along the last dim of [T, heads, D]."""
    return t.reshape(*t.shape[:-1], head_dim // 2, 2).transpose(-1, -2).reshape(t.shape)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_complex_rotary_matches_rotate_half(dtype, tol):
    g = torch.Generator().manual_seed(0)
    heads, d, t = 3, 16, 11
    x = torch.randn(t, heads, d, generator=g)
    positions = torch.randint(0, 500, (t,), generator=g)
    rope = RotaryEmbedding(d, 512, {"rope_theta": 10000.0, "rope_type": "default"})
    # the loader interleaves the projection rows; here: the projection's output
    x_inter = interleave_halves(x.reshape(t, heads * d).T, d).T.reshape(t, heads, d)
    got = apply_rotary(x_inter.to(dtype), rope.rotations(positions))
    assert got.dtype == dtype and got.shape == x.shape
    want = _rotate_half_reference(x, positions, 10000.0)
    err = (_deinterleave(got.double(), d) - want).abs().max().item()
    assert err <= tol * want.abs().max().item(), err


def test_interleave_is_a_permutation_that_keeps_dot_products():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(2 * 8, 5, generator=g)            # 2 heads of dim 8, 5 inputs
    p = interleave_halves(w, 8)
    assert torch.equal(p[:8].sort(0).values, w[:8].sort(0).values)
    assert torch.equal(p[[0, 1, 2, 3]], w[[0, 4, 1, 5]])
    q, k = torch.randn(5, generator=g), torch.randn(5, generator=g)
    assert torch.allclose((w @ q).reshape(2, 8) @ (w @ k).reshape(2, 8).T,
                          (p @ q).reshape(2, 8) @ (p @ k).reshape(2, 8).T, atol=1e-5)
