"""The attention-backend interface.

A backend turns the step's one flat batch description (`AttentionMetadata`: per request
its flat start offset, k tokens already cached, n new tokens, block table, and the cache
slot of every new token) into whatever layout it needs (`build`, once per step, shared by
every layer), then runs a layer's attention (`forward`). The layer has already written the
step's new K/V into its paged cache (`layer.kv_cache`: [2, slots, Hkv, D], None for
bidirectional models), so a request that shares a prefix with another in the same step
reads blocks that are already written.

Adding a backend: subclass this, give it a `name`, register it in `registry.py`, and teach
the platforms that can run it (`backend_preference`, `backend_unavailable`).
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch

from vllm.attention.metadata import AttentionMetadata


class AttentionBackend:
    name: ClassVar[str]

    def build(self, meta: AttentionMetadata) -> Any:
        """This backend's per-step metadata (built once per step; see `meta.prepared`)."""
        raise NotImplementedError

    def forward(self, layer: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] (the step's new tokens, flat) -> [T, Hq, D].
        `layer` carries num_heads, num_kv_heads, head_dim, scale and kv_cache."""
        raise NotImplementedError
