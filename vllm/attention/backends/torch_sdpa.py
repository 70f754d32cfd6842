"""TORCH_SDPA: the device-neutral reference backend (any device, any dtype).

Requests are bucketed (`sdpa_groups`) so each bucket is one `F.scaled_dot_product_attention`
call: equal-length requests that read no cache as one batched zero-copy view, mixed lengths
one call each on zero-copy slices, cache readers padded into a batch with an explicit mask.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from vllm.attention.backends.abstract import AttentionBackend
from vllm.attention.backends.sdpa_groups import AttentionGroup, build_groups
from vllm.attention.metadata import AttentionMetadata


class _Groups:
    """The group layout under TORCH_SDPA's name, also for subclasses that fall back to it."""

    name = "TORCH_SDPA"
    build = staticmethod(build_groups)


class TorchSdpaBackend(AttentionBackend):
    name = "TORCH_SDPA"

    def build(self, meta: AttentionMetadata) -> list[AttentionGroup]:
        return build_groups(meta)

    def forward(self, layer: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        groups = meta.prepared(_Groups)
        if len(groups) == 1 and groups[0].kind != "loop":
            return self.group(layer, q, k, v, groups[0], meta.causal)
        out = q.new_empty(q.shape[0], layer.num_heads, layer.head_dim)
        for g in groups:
            if g.kind == "loop":
                self._loop(layer, q, k, v, g, meta.causal, out)
            else:
                out[g.start: g.end] = self.group(layer, q, k, v, g, meta.causal)
        return out

    def group(self, layer: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              g: AttentionGroup, causal: bool) -> torch.Tensor:
        """Attention of a "view" or "padded" group: its [t_g, Hq, D] rows in flat order."""
        if g.kind == "view":
            b = len(g.lengths)
            o = _sdpa(layer, *(_view(x, g.start, g.end, b) for x in (q, k, v)), None, causal)
            return o.reshape(-1, layer.num_heads, layer.head_dim)
        qp = q[g.rows]                                             # [b, Lq, Hq, D]
        kp = layer.kv_cache[0][g.key_slots]                        # [b, Lk, Hkv, D]
        vp = layer.kv_cache[1][g.key_slots]
        o = _sdpa(layer, qp, kp, vp, g.mask, False)                # [b, Lq, Hq, D]
        return o[g.valid] if g.valid is not None else o.reshape(-1, *o.shape[2:])

    @staticmethod
    def _loop(layer: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              g: AttentionGroup, causal: bool, out: torch.Tensor) -> None:
        """One call per request on zero-copy slices, written straight into `out`."""
        s = g.start
        for n in g.lengths:
            o = _sdpa(layer, *(_view(x, s, s + n, 1) for x in (q, k, v)), None, causal)
            out[s: s + n] = o[0]
            s += n


def _view(x: torch.Tensor, start: int, end: int, b: int) -> torch.Tensor:
    """Flat rows start:end as [b, L, heads, D] without copying."""
    return x[start:end].view(b, -1, x.shape[1], x.shape[2])


def _sdpa(layer: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          mask: Optional[torch.Tensor], is_causal: bool) -> torch.Tensor:
    """[B, L, H, D] tensors in, [B, Lq, Hq, D] out."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
        is_causal=is_causal and mask is None, scale=layer.scale,
        enable_gqa=layer.num_kv_heads != layer.num_heads)
    return out.transpose(1, 2)
