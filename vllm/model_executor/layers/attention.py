"""Attention over a flat, padding-free batch, with an optional paged KV cache.

Causal layers write the new tokens' K/V into their cache slots first, then their backend
attends from the n new queries over the request's k cached + n new keys. Writing every new
token of the step before any request reads means requests that share a prefix inside one
step read blocks that are already written. Bidirectional layers keep no cache and see
exactly their request's own tokens.

The backend (vllm/attention/backends) is chosen once per model by the platform and bound by
the model runner (`bind_attention`); an unbound layer runs TORCH_SDPA, the reference.
Two optional per-layer features (ModernBERT, Gemma 2/3), `window` = (left, right) and
`softcap`, take the device-neutral masked path (`backends/masked.py`) in the steps where
they change a score, unless the backend applies them itself. Two optional backend hooks
(TRITON_ATTN has both): `write_kv(layer, k, v, meta)` replaces the cache write, and a true
`handles_window_softcap` keeps windowed/softcapped steps on the backend.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from vllm.attention.backends.abstract import AttentionBackend
from vllm.attention.backends.masked import masked_attention, needs_mask
from vllm.attention.backends.registry import get_backend
from vllm.attention.metadata import AttentionMetadata


class Attention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, num_kv_heads: int,
                 scale: Optional[float] = None, window: Optional[tuple[int, int]] = None,
                 softcap: Optional[float] = None) -> None:
        super().__init__()
        self.window = window
        self.softcap = softcap
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_kv_heads = num_kv_heads
        self.scale = scale if scale is not None else head_dim ** -0.5
        # [2, num_slots, num_kv_heads, head_dim], bound by the model runner (None: no cache).
        self.kv_cache: Optional[torch.Tensor] = None
        self.backend: AttentionBackend = get_backend("TORCH_SDPA")
        # A float32 layer's attention may run on CPU_NATIVE's AVX512-BF16 kernel, q and k
        # (bf16_pv: and v and the softmax weights) rounded to bfloat16 as the kernel copies
        # them, its cache's readers too. Set for int8 models by `bind_ops` where the
        # platform says so (`Platform.int8_bf16_attention`).
        self.bf16_ok = False
        self.bf16_pv = False

    def rounds_to_bf16(self) -> bool:
        """Whether this float32 layer rounds q, k and v to bfloat16 itself (bf16_ok with
        bf16_pv) and keeps no cache: its q/k/v projection may then hand them over as
        bfloat16 (`Linear.forward_bf16`), the same values, and the output stays float32."""
        return self.bf16_ok and self.bf16_pv and self.kv_cache is None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, Hq*D], k/v: [T, Hkv*D] -> [T, Hq*D] (float32 where `rounds_to_bf16` and
        they came as bfloat16)."""
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.kv_cache is not None and meta.slot_mapping is not None:
            write_kv = getattr(self.backend, "write_kv", None)   # optional backend hook
            if write_kv is not None:
                write_kv(self, k, v, meta)
            else:
                self.kv_cache[0].index_copy_(0, meta.slot_mapping, k)
                self.kv_cache[1].index_copy_(0, meta.slot_mapping, v)
        if (self.window is not None or self.softcap is not None) and \
                not getattr(self.backend, "handles_window_softcap", False) and \
                needs_mask(self, meta):
            return masked_attention(self, q, k, v, meta).reshape(t, -1)
        return self.backend.forward(self, q, k, v, meta).reshape(t, -1)


def bind_attention(model: nn.Module, backend: AttentionBackend) -> int:
    """Every `Attention` of `model` runs on `backend` from now on; returns how many."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    for layer in layers:
        layer.backend = backend
    return len(layers)
