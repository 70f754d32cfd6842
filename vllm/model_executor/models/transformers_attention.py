"""The engine's attention behind transformers 5's attention-function registry.

A transformers model whose config names `ATTN_IMPLEMENTATION` calls `engine_attention` in
every attention layer with q [1, Hq, T, D] and k, v [1, Hkv, T, D] over the whole flat
step (input_ids [1, T], position_ids = the engine's positions). The step's
AttentionMetadata rides in the forward's keyword arguments (`STEP_KWARG`), which
transformers hands down to this function untouched. Each HF attention module holds the
engine `Attention` it maps to (`vllm_attn`, attached by the load-time probe); that layer
writes the paged KV cache and runs the bound backend, so prefix caching and chunked
prefill behave exactly as for native models. transformers builds no mask for a name it
does not know (masking_utils exits early), which is what a flat, padding-free batch needs:
the metadata says where each request starts and how much of it is cached.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.layers.attention import Attention

ATTN_IMPLEMENTATION = "vllm_engine"
STEP_KWARG = "vllm_attention_metadata"


class AttentionProbe:
    """Passed instead of metadata by the load-time probe: records each attention module
    once, in call order, and computes plain SDPA so the forward can finish."""

    def __init__(self) -> None:
        self.modules: list[torch.nn.Module] = []
        self.shapes: list[tuple[int, int, int]] = []   # (Hq, Hkv, D) per module
        self.problem: Optional[str] = None

    def record(self, module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor) -> None:
        if any(m is module for m in self.modules):
            self.problem = f"{type(module).__name__} runs more than once per forward " \
                "(shared layers cannot each own a KV cache)"
        elif v.shape[-1] != q.shape[-1] or k.shape[-1] != q.shape[-1]:
            self.problem = f"{type(module).__name__} has different query/key/value head sizes"
        self.modules.append(module)
        self.shapes.append((q.shape[1], k.shape[1], q.shape[-1]))


def engine_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                     scaling: Optional[float] = None, dropout: float = 0.0,
                     sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature -> ([1, T, Hq, D], no weights)."""
    step = kwargs.get(STEP_KWARG)
    if isinstance(step, AttentionProbe):
        step.record(module, query, key, value)
        return _plain_sdpa(module, query, key, value, scaling), None
    if not isinstance(step, AttentionMetadata):
        raise RuntimeError(f"attention implementation {ATTN_IMPLEMENTATION!r} runs only "
                           "inside the engine, which passes the step's metadata")
    layer: Attention = module.vllm_attn
    t = query.shape[2]
    layer.scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    layer.softcap = softcap
    layer.window = None if not sliding_window else \
        (sliding_window - 1, 0 if step.causal else sliding_window - 1)
    q = query[0].transpose(0, 1).reshape(t, -1)
    k = key[0].transpose(0, 1).reshape(t, -1)
    v = value[0].transpose(0, 1).reshape(t, -1)
    out = layer(q, k, v, step)
    return out.view(1, t, layer.num_heads, layer.head_dim), None


def _plain_sdpa(module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                scaling: Optional[float]) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, scale=scaling,
                                         is_causal=bool(getattr(module, "is_causal", False)))
    return out.transpose(1, 2).contiguous()


def attach_engine_layers(probe: AttentionProbe) -> list[Attention]:
    """One engine `Attention` per probed HF module (its `vllm_attn`), in call order."""
    layers = []
    for module, (hq, hkv, d) in zip(probe.modules, probe.shapes):
        module.vllm_attn = Attention(hq, d, hkv)
        layers.append(module.vllm_attn)
    return layers


AttentionInterface.register(ATTN_IMPLEMENTATION, engine_attention)
