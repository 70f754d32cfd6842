"""DeBERTa-v2 / v3 encoder (bidirectional) and its sequence-classification head.

Disentangled attention: besides content-to-content scores, every query/key pair gets a
content-to-position (c2p) and a position-to-content (p2c) score read from projections of
shared relative-position embeddings, indexed by the log-bucketed distance between the two
tokens. That bias depends on each pair's distance, so the layer computes its attention
itself, one request at a time (an encoder: no KV cache). Module names equal Hugging
Face's, so checkpoints load by name.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.weight_utils import copy_param

_ACTS = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
         "relu": F.relu, "tanh": torch.tanh}


def _act(name: str):
    if name not in _ACTS:
        raise ValueError(f"activation {name!r} is not supported (supported: {', '.join(_ACTS)})")
    return _ACTS[name]


def log_bucket(rel: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """DeBERTa's relative-position buckets: exact within +-buckets/2, log-spaced beyond."""
    sign = torch.sign(rel)
    mid = buckets // 2
    near = (rel < mid) & (rel > -mid)
    abs_pos = torch.where(near, torch.tensor(mid - 1).type_as(rel), rel.abs())
    log_pos = torch.ceil(torch.log(abs_pos / mid) / math.log((max_position - 1) / mid)
                         * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, rel.type_as(log_pos), log_pos * sign).long()


class _Rel:
    """The relative-position settings shared by every layer."""

    def __init__(self, config) -> None:
        self.max_positions = getattr(config, "max_relative_positions", -1)
        if self.max_positions < 1:
            self.max_positions = config.max_position_embeddings
        self.buckets = getattr(config, "position_buckets", -1)
        self.span = self.buckets if self.buckets > 0 else self.max_positions

    def positions(self, n: int, device) -> torch.Tensor:
        """[n, n] (bucketed) query - key distance."""
        idx = torch.arange(n, device=device)
        rel = idx[:, None] - idx[None, :]
        if self.buckets > 0 and self.max_positions > 0:
            rel = log_bucket(rel, self.buckets, self.max_positions)
        return rel


class DisentangledSelfAttention(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = h // self.num_heads
        self.query_proj = nn.Linear(h, h)
        self.key_proj = nn.Linear(h, h)
        self.value_proj = nn.Linear(h, h)
        self.share_att_key = getattr(config, "share_att_key", False)
        self.pos_att_type = list(getattr(config, "pos_att_type", None) or [])
        self.relative = getattr(config, "relative_attention", False)
        if self.relative and not self.share_att_key:
            if "c2p" in self.pos_att_type:
                self.pos_key_proj = nn.Linear(h, h)
            if "p2c" in self.pos_att_type:
                self.pos_query_proj = nn.Linear(h, h)
        self.scale = math.sqrt(self.head_dim * (1 + len(self.pos_att_type)))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], self.num_heads, self.head_dim).transpose(0, 1)  # [H, L, D]

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, rel_emb: Optional[torch.Tensor],
                rel: _Rel) -> torch.Tensor:
        q, k, v = self.query_proj(x), self.key_proj(x), self.value_proj(x)
        pos_k = pos_q = None
        if self.relative:
            key_proj = self.key_proj if self.share_att_key else getattr(self, "pos_key_proj", None)
            query_proj = self.query_proj if self.share_att_key else \
                getattr(self, "pos_query_proj", None)
            if "c2p" in self.pos_att_type:
                pos_k = self._heads(key_proj(rel_emb))      # [H, 2S, D]
            if "p2c" in self.pos_att_type:
                pos_q = self._heads(query_proj(rel_emb))
        out = torch.empty_like(q)
        starts = meta.query_start_loc
        for s, e in zip(starts[:-1], starts[1:]):
            out[s:e] = self._request(*(self._heads(t[s:e]) for t in (q, k, v)), pos_k, pos_q, rel)
        return out

    def _request(self, q, k, v, pos_k, pos_q, rel: _Rel) -> torch.Tensor:
        """One request's [L, H*D] attention output from [H, L, D] q/k/v."""
        scores = q @ k.transpose(1, 2) / self.scale
        if self.relative:
            n, span = q.shape[1], rel.span
            rp = rel.positions(n, q.device)
            if pos_k is not None:  # content -> position
                c2p = q @ pos_k.transpose(1, 2)                       # [H, L, 2S]
                idx = (rp + span).clamp(0, 2 * span - 1)
                scores = scores + torch.gather(c2p, -1, idx.expand(q.shape[0], n, n)) / self.scale
            if pos_q is not None:  # position -> content
                p2c = k @ pos_q.transpose(1, 2)                       # [H, L, 2S]
                idx = (-rp + span).clamp(0, 2 * span - 1)
                p2c = torch.gather(p2c, -1, idx.expand(q.shape[0], n, n)).transpose(1, 2)
                scores = scores + p2c / self.scale
        probs = torch.softmax(scores, dim=-1)
        return (probs @ v).transpose(0, 1).reshape(q.shape[1], -1)


class _Dense(nn.Module):
    """`dense` then LayerNorm(x + residual), HF's SelfOutput / Output."""

    def __init__(self, d_in: int, config) -> None:
        super().__init__()
        self.dense = nn.Linear(d_in, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class _Attention(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        setattr(self, "self", DisentangledSelfAttention(config))
        self.output = _Dense(config.hidden_size, config)


class _Intermediate(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = _act(config.hidden_act)


class DebertaV2Layer(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.attention = _Attention(config)
        self.intermediate = _Intermediate(config)
        self.output = _Dense(config.intermediate_size, config)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, rel_emb, rel: _Rel):
        attn = self.attention.output(getattr(self.attention, "self")(x, meta, rel_emb, rel), x)
        inter = self.intermediate
        return self.output(inter.act(inter.dense(attn)), attn)


class DebertaV2Embeddings(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        e = getattr(config, "embedding_size", None) or config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, e)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, e) \
            if getattr(config, "position_biased_input", True) else None
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, e) \
            if config.type_vocab_size > 0 else None
        self.embed_proj = nn.Linear(e, config.hidden_size, bias=False) \
            if e != config.hidden_size else None
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids, positions, token_type_ids) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(positions)
        if self.token_type_embeddings is not None:
            x = x + (self.token_type_embeddings.weight[0] if token_type_ids is None
                     else self.token_type_embeddings(token_type_ids))
        if self.embed_proj is not None:
            x = self.embed_proj(x)
        return self.LayerNorm(x)


class DebertaV2Encoder(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.layer = nn.ModuleList(DebertaV2Layer(config) for _ in range(config.num_hidden_layers))
        self.rel = _Rel(config)
        if getattr(config, "relative_attention", False):
            self.rel_embeddings = nn.Embedding(2 * self.rel.span, config.hidden_size)
        norm = [x.strip() for x in getattr(config, "norm_rel_ebd", "none").lower().split("|")]
        if "layer_norm" in norm:
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def rel_embedding(self) -> Optional[torch.Tensor]:
        if not hasattr(self, "rel_embeddings"):
            return None
        emb = self.rel_embeddings.weight
        return self.LayerNorm(emb) if hasattr(self, "LayerNorm") else emb


class DebertaV2Model(nn.Module):
    """forward(input_ids[T], positions[T], meta, token_type_ids) -> hidden_states[T, H]."""

    default_pooling_type = "CLS"
    is_causal = False
    weight_prefix = "deberta."

    def __init__(self, config) -> None:
        super().__init__()
        if getattr(config, "conv_kernel_size", 0) > 0:
            raise ValueError("DeBERTa-v2 checkpoints with a convolution layer "
                             "(conv_kernel_size > 0) are not supported; DeBERTa-v3 has none.")
        self.config = config
        self.embeddings = DebertaV2Embeddings(config)
        self.encoder = DebertaV2Encoder(config)

    def attention_layers(self) -> list:
        """None of its layers keeps a KV cache (see `ModelRunner`'s sizing)."""
        return []

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata,
                token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.embeddings(input_ids, positions, token_type_ids)
        rel_emb = self.encoder.rel_embedding()
        for layer in self.encoder.layer:
            x = layer(x, meta, rel_emb, self.encoder.rel)
        return x if meta.output_rows is None else x[meta.output_rows]

    @staticmethod
    def skip_weight(name: str) -> bool:
        return name.endswith("position_ids") or name.startswith(("pooler.", "lm_predictions.",
                                                                  "mask_predictions."))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if name not in params:
                raise ValueError(f"checkpoint weight {name!r} has no place in "
                                 f"{type(self).__name__}")
            copy_param(params[name], tensor, name)
            loaded.add(name)
        return loaded


class _ContextPooler(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        size = getattr(config, "pooler_hidden_size", None) or config.hidden_size
        self.dense = nn.Linear(size, size)
        self.act = _act(getattr(config, "pooler_hidden_act", "gelu"))


class DebertaV2ClassifierHead(nn.Module):
    """ContextPooler (dense + activation on the CLS state), then the classifier."""

    def __init__(self, config, num_labels: int) -> None:
        super().__init__()
        self.pooler = _ContextPooler(config)
        self.classifier = nn.Linear(self.pooler.dense.out_features, num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pooler.act(self.pooler.dense(pooled)))


class DebertaV2ForSequenceClassification(DebertaV2Model):
    @staticmethod
    def skip_weight(name: str) -> bool:
        return name.endswith("position_ids")

    @staticmethod
    def build_classifier(config, num_labels: int, names: set[str]) -> nn.Module:
        return DebertaV2ClassifierHead(config, num_labels)
