"""One causal decoder implementation for the Llama family (Llama, Mistral, Qwen2, Qwen3).

The families differ only in switches read from the config: QKV bias (Qwen2), per-head
QK RMSNorm (Qwen3), explicit head_dim, and rope settings. A `is_causal: false` config
(LLM2Vec-style encoders such as gte-Qwen2) runs the same weights bidirectionally.
"""
from __future__ import annotations

import re
from typing import Iterable, Optional

import torch
from torch import nn

from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import GatedLinear, Linear, mlp_add
from vllm.model_executor.layers.norm import RMSNorm
from vllm.model_executor.layers.rotary import (RotaryEmbedding, apply_rotary,
                                               interleave_halves, rope_parameters)
from vllm.model_executor.lora_target import LoRATarget, linear_at, whole
from vllm.model_executor.weight_utils import copy_param, copy_shard

# Query/key projections and their per-head norms: stored with rotary pairs interleaved.
_ROTATED = re.compile(r"\.(q_proj|k_proj|q_norm|k_norm)\.(weight|bias)$")
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def rotated_qkv(layer: nn.Module, x: torch.Tensor,
                rotation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused [q; k; v] projection of a decoder attention `layer` (Llama-family or Gemma),
    per-head QK norms where it has them, and rotary on q and k: flat [T, H*D] tensors."""
    t = x.shape[0]
    q, k, v = layer.qkv_proj(x).split(layer.shard_sizes, dim=-1)
    q = q.reshape(t, layer.num_heads, layer.head_dim)
    k = k.reshape(t, layer.num_kv_heads, layer.head_dim)
    if layer.q_norm is not None:
        q, k = layer.q_norm(q), layer.k_norm(k)
    q, k = apply_rotary(q, rotation), apply_rotary(k, rotation)
    return q.reshape(t, -1), k.reshape(t, -1), v


class DecoderAttention(nn.Module):
    def __init__(self, config, qkv_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or h // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.shard_sizes = [self.q_size, self.kv_size, self.kv_size]
        self.qkv_proj = Linear(h, sum(self.shard_sizes), bias=qkv_bias)
        self.o_proj = Linear(self.q_size, h, bias=False)
        eps = getattr(config, "rms_norm_eps", 1e-6)
        self.q_norm = RMSNorm(self.head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps) if qk_norm else None
        self.attn = Attention(self.num_heads, self.head_dim, self.num_kv_heads)

    def forward(self, x: torch.Tensor, rotation: torch.Tensor,
                meta: AttentionMetadata, residual: torch.Tensor,
                rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """residual + attention output (only `rows` when given)."""
        out = self.attn(*rotated_qkv(self, x, rotation), meta)
        return self.o_proj.forward_add(out if rows is None else out[rows], residual)


class DecoderMLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.shard_sizes = [i, i]
        self.gate_up_proj = GatedLinear(h, i)
        self.down_proj = Linear(i, h, bias=False)
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported for decoder models (silu)")

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + the MLP of x."""
        return mlp_add(self.gate_up_proj, self.down_proj, x, residual)


class DecoderLayer(nn.Module):
    def __init__(self, config, qkv_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        eps = getattr(config, "rms_norm_eps", 1e-6)
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.self_attn = DecoderAttention(config, qkv_bias, qk_norm)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
        self.mlp = DecoderMLP(config)

    def forward(self, x: torch.Tensor, rotation: torch.Tensor,
                meta: AttentionMetadata, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`rows`: keep only these rows after attention (every token's K/V is still
        written to the cache)."""
        residual = x if rows is None else x[rows]
        x = self.self_attn(self.input_layernorm(x), rotation, meta, residual, rows)
        return self.mlp(self.post_attention_layernorm(x), x)


class DecoderModel(nn.Module):
    """forward(input_ids[T], positions[T], meta) -> hidden_states[T, H] (final norm applied;
    only the `meta.output_rows` rows when those are given)."""

    default_pooling_type = "LAST"
    is_causal = True
    qkv_bias = False
    qk_norm = False
    weight_prefix = "model."
    # Transformers' *ForCausalLM tie (`model_loader._tie_plan`): a checkpoint may hold only
    # lm_head; `classifier_from_token` reads lm_head rows, taken from embed_tokens if absent.
    tied_weights = {"lm_head.weight": "embed_tokens.weight"}

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        qkv_bias = self.qkv_bias or bool(getattr(config, "attention_bias", False))
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, qkv_bias, self.qk_norm)
                                    for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, getattr(config, "rms_norm_eps", 1e-6))
        attn = self.layers[0].self_attn
        self.rotary = RotaryEmbedding(attn.head_dim, config.max_position_embeddings,
                                      rope_parameters(config))


    def lora_target(self, module: str) -> LoRATarget:
        """Where PEFT's `module` lands: q/k/v and gate/up are rows of our fused projections
        (q and k rows with rotary pairs interleaved, as the loader stored them)."""
        parent, _, leaf = module.rpartition(".")
        if leaf not in _FUSED:
            return whole(self, module)
        fused, shard = _FUSED[leaf]
        path = f"{parent}.{fused}"
        sizes = self.get_submodule(parent).shard_sizes
        head_dim = self.layers[0].self_attn.head_dim
        reorder = (lambda b: interleave_halves(b, head_dim)) if leaf in ("q_proj", "k_proj") \
            else None
        return LoRATarget(path, linear_at(self, path), sum(sizes[:shard]), sizes[shard],
                          reorder)
    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.layers]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata,
                token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rotation = self.rotary.rotations(positions)
        for layer in self.layers[:-1]:
            x = layer(x, rotation, meta)
        return self.norm(self.layers[-1](x, rotation, meta, meta.output_rows))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load backbone tensors named as in HF (prefix already stripped); returns the
        names of the parameters that were set. Query/key rows and QK-norm weights are
        reordered for the complex-multiply rotary (`rotary.interleave_halves`)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        head_dim = self.layers[0].self_attn.head_dim
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if _ROTATED.search(name):
                tensor = interleave_halves(tensor, head_dim)
            parts = name.split(".")
            fused = next(((i, _FUSED[p]) for i, p in enumerate(parts) if p in _FUSED), None)
            if fused is not None:
                i, (target, shard) = fused
                pname = ".".join(parts[:i] + [target] + parts[i + 1:])
                module = self.get_submodule(".".join(parts[:i - 1] + [parts[i - 1]]))
                copy_shard(params[pname], module.shard_sizes, shard, tensor)
            else:
                if name not in params:
                    raise ValueError(f"checkpoint weight {name!r} has no place in "
                                     f"{type(self).__name__}")
                pname = name
                copy_param(params[pname], tensor, name)
            loaded.add(pname)
        return loaded

    @staticmethod
    def skip_weight(name: str) -> bool:
        return name.startswith("lm_head.") or "rotary_emb.inv_freq" in name

    @staticmethod
    def build_classifier(config, num_labels: int, names: set[str]) -> nn.Module:
        from vllm.model_executor.models.adapters import ScoreHead
        return ScoreHead(config.hidden_size, num_labels, bias="score.bias" in names)
