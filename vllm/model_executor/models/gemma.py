"""Gemma 2 and Gemma 3 (text) decoders, causal or bidirectional (EmbeddingGemma).

What sets them apart from the Llama family (`decoder.py`, whose weight loader they share):
embeddings scaled by sqrt(hidden); RMSNorm weights stored as an offset from one (the
loader adds the one); norms after attention and around the MLP; a GeGLU MLP (tanh gelu);
attention scaled by `query_pre_attn_scalar ** -0.5`; sliding-window attention on the
layers `layer_types` marks "sliding_attention" (each kind with its own rope in Gemma 3);
Gemma 2's attention-logit softcapping; Gemma 3's per-head QK RMSNorm.

`final_logit_softcapping` acts on language-model logits only, which a pooling model never
computes, so it is not applied here.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import Linear
from vllm.model_executor.layers.norm import RMSNorm
from vllm.model_executor.layers.rotary import RotaryEmbedding, rope_parameters
from vllm.model_executor.models.decoder import DecoderModel, rotated_qkv


def _layer_types(config) -> list[str]:
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    return ["sliding_attention" if (i + 1) % 2 else "full_attention"
            for i in range(config.num_hidden_layers)]


def _rope(config, kind: str) -> dict:
    """Gemma 3 keeps one rope per layer kind; Gemma 2 one for all."""
    per_kind = getattr(config, "rope_parameters", None) or {}
    if kind in per_kind:
        params = dict(per_kind[kind])
        params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
        return params
    return rope_parameters(config)


def bidirectional(config) -> bool:
    return bool(getattr(config, "use_bidirectional_attention", False)) or \
        getattr(config, "is_causal", True) is False


def _window(config, kind: str) -> Optional[tuple[int, int]]:
    """(left, right) of a sliding layer: the query and the W - 1 keys before it (causal),
    or every key less than W away on either side (bidirectional, as Transformers masks
    EmbeddingGemma, whose loaded `sliding_window` is already halved plus one)."""
    w = getattr(config, "sliding_window", None)
    if kind != "sliding_attention" or not w:
        return None
    return (w - 1, w - 1) if bidirectional(config) else (w - 1, 0)


class GemmaAttention(nn.Module):
    def __init__(self, config, kind: str, qk_norm: bool) -> None:
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or h // self.num_heads
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.shard_sizes = [q, kv, kv]
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = Linear(h, q + 2 * kv, bias=bias)
        self.o_proj = Linear(q, h, bias=bias)
        eps = config.rms_norm_eps
        self.q_norm = RMSNorm(self.head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps) if qk_norm else None
        self.attn = Attention(self.num_heads, self.head_dim, self.num_kv_heads,
                              scale=config.query_pre_attn_scalar ** -0.5,
                              window=_window(config, kind),
                              softcap=getattr(config, "attn_logit_softcapping", None))

    def forward(self, x: torch.Tensor, rotation: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        return self.o_proj(self.attn(*rotated_qkv(self, x, rotation), meta))


class GemmaMLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.shard_sizes = [i, i]
        self.gate_up_proj = Linear(h, 2 * i, bias=False)
        self.down_proj = Linear(i, h, bias=False)
        act = getattr(config, "hidden_activation", None) or config.hidden_act
        if act not in ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new"):
            raise ValueError(f"hidden_activation {act!r} is not supported for Gemma "
                             "(gelu_pytorch_tanh)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaLayer(nn.Module):
    def __init__(self, config, kind: str, qk_norm: bool) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.kind = kind
        self.input_layernorm = RMSNorm(h, eps)
        self.self_attn = GemmaAttention(config, kind, qk_norm)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.pre_feedforward_layernorm = RMSNorm(h, eps)
        self.mlp = GemmaMLP(config)
        self.post_feedforward_layernorm = RMSNorm(h, eps)

    def forward(self, x: torch.Tensor, rotation: torch.Tensor, meta: AttentionMetadata,
                rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`rows`: keep only these rows after attention (every token's K/V is written)."""
        attn = self.self_attn(self.input_layernorm(x), rotation, meta)
        if rows is not None:
            x, attn = x[rows], attn[rows]
        x = x + self.post_attention_layernorm(attn)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma2Model(DecoderModel):
    """forward(input_ids[T], positions[T], meta) -> hidden_states[T, H] (final norm applied;
    only the `meta.output_rows` rows when those are given)."""

    qk_norm = False

    def __init__(self, config) -> None:  # noqa: super().__init__ builds Llama layers
        nn.Module.__init__(self)
        self.config = config
        kinds = _layer_types(config)[: config.num_hidden_layers]
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GemmaLayer(config, kind, self.qk_norm) for kind in kinds)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        head_dim = self.layers[0].self_attn.head_dim
        self.rotary = {kind: RotaryEmbedding(head_dim, config.max_position_embeddings,
                                             _rope(config, kind)) for kind in set(kinds)}

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata,
                token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        x = x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype)
        rotations = {kind: r.rotations(positions) for kind, r in self.rotary.items()}
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, rotations[layer.kind], meta, meta.output_rows if i == last else None)
        return self.norm(x)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """As the Llama family's loader, with every RMSNorm weight stored as w - 1."""
        return super().load_weights(
            (name, tensor.float() + 1.0 if name.endswith("norm.weight") else tensor)
            for name, tensor in weights)


class Gemma3Model(Gemma2Model):
    """Gemma 3 text: Gemma 2's layout with per-head QK RMSNorm (no softcapping unless the
    config sets it); `use_bidirectional_attention` makes it EmbeddingGemma's encoder."""

    qk_norm = True
