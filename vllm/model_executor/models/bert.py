"""BERT encoder (bidirectional) and its sequence-classification head."""
from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import Linear, mlp_add
from vllm.model_executor.lora_target import LoRATarget, linear_at, whole
from vllm.model_executor.weight_utils import load_mapped

# HF `hidden_act` -> the activation fused into the intermediate projection.
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "relu": "relu"}
_QKV = {"query": 0, "key": 1, "value": 2}


def get_activation(name: str) -> str:
    if name not in _ACTIVATIONS:
        raise ValueError(f"hidden_act {name!r} is not supported (supported: "
                         f"{', '.join(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


class BertEmbeddings(nn.Module):
    def __init__(self, config, position_offset: int = 0) -> None:
        super().__init__()
        h = config.hidden_size
        self.position_offset = position_offset
        self.word_embeddings = nn.Embedding(config.vocab_size, h)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h)
        self.token_type_embeddings = nn.Embedding(max(config.type_vocab_size, 1), h)
        self.LayerNorm = nn.LayerNorm(h, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: Optional[torch.Tensor]) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        x = x + self.position_embeddings(positions + self.position_offset)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class BertLayer(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.num_heads = config.num_attention_heads
        self.head_dim = h // self.num_heads
        self.shard_sizes = [h, h, h]
        self.qkv = Linear(h, 3 * h)
        self.attn = Attention(self.num_heads, self.head_dim, self.num_heads)
        self.attn_out = Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.intermediate = Linear(h, i, activation=get_activation(config.hidden_act))
        self.out = Linear(i, h)
        self.out_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata,
                rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`rows`: keep only these rows after attention (the last layer under CLS/LAST)."""
        qkv = self.qkv.forward_bf16(x) if self.attn.rounds_to_bf16() else self.qkv(x)
        q, k, v = qkv.split(self.shard_sizes, dim=-1)
        attn = self.attn(q, k, v, meta)
        if rows is not None:
            x, attn = x[rows], attn[rows]
        x = self.attn_out.forward_add_norm(attn, x, self.attn_norm)
        return mlp_add(self.intermediate, self.out, x, x, self.out_norm)


# HF sub-names -> ours, inside one encoder layer.
_LAYER_NAMES = {
    "attention.output.dense": "attn_out", "attention.output.LayerNorm": "attn_norm",
    "intermediate.dense": "intermediate", "output.dense": "out",
    "output.LayerNorm": "out_norm",
}


class BertModel(nn.Module):
    """forward(input_ids[T], positions[T], meta, token_type_ids) -> hidden_states[T, H]
    (only the `meta.output_rows` rows when those are given)."""

    default_pooling_type = "CLS"
    is_causal = False
    weight_prefix = "bert."
    position_offset = 0

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config, self._position_offset(config))
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def _position_offset(self, config) -> int:
        return self.position_offset

    def lora_target(self, module: str) -> LoRATarget:
        """Where PEFT's `module` lands: query/key/value are thirds of our fused `qkv`."""
        pname, shard = _map_bert_name(module + ".weight")
        path = pname[: -len(".weight")]
        if shard is None:
            return whole(self, path)
        h = self.config.hidden_size
        return LoRATarget(path, linear_at(self, path), shard * h, h)

    def attention_layers(self) -> list[Attention]:
        return [layer.attn for layer in self.layers]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata,
                token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.embeddings(input_ids, positions, token_type_ids)
        for layer in self.layers[:-1]:
            x = layer(x, meta)
        return self.layers[-1](x, meta, meta.output_rows)

    @staticmethod
    def skip_weight(name: str) -> bool:
        """Checkpoint tensors the backbone does not use (buffers, the unused pooler)."""
        return name.endswith("position_ids") or name.startswith("pooler.")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_mapped(self, weights, lambda name: _map_bert_name(
            name.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
                "LayerNorm.beta", "LayerNorm.bias")))


def _map_bert_name(name: str) -> tuple[str, Optional[int]]:
    if not name.startswith("encoder.layer."):
        return name, None
    rest = name[len("encoder.layer."):]
    idx, sub = rest.split(".", 1)
    if sub.startswith("attention.self."):
        which, kind = sub[len("attention.self."):].split(".", 1)
        return f"layers.{idx}.qkv.{kind}", _QKV[which]
    module, kind = sub.rsplit(".", 1)
    return f"layers.{idx}.{_LAYER_NAMES.get(module, module)}.{kind}", None


class _BertPooler(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)


class BertClassifierHead(nn.Module):
    """BERT's sequence-classification head on the CLS state: pooler dense + tanh, then
    the classifier. Parameter names equal the checkpoint's (after the `bert.` prefix)."""

    def __init__(self, config, num_labels: int) -> None:
        super().__init__()
        self.pooler = _BertPooler(config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.tanh(self.pooler.dense(pooled)))

    def per_token(self, hidden: torch.Tensor) -> torch.Tensor:
        """`token_classify`: the classifier on every token's state (the pooler's dense +
        tanh belong to the CLS summary, as upstream)."""
        return self.classifier(hidden)


class BertForSequenceClassification(BertModel):
    """The BERT backbone; its classifier head is built by `build_classifier`."""

    @staticmethod
    def skip_weight(name: str) -> bool:
        return name.endswith("position_ids")

    @staticmethod
    def build_classifier(config, num_labels: int, names: set[str]) -> nn.Module:
        return BertClassifierHead(config, num_labels)


class TokenClassifierMixin:
    """A BERT-family backbone with a linear `classifier` applied to every token (NER)."""

    @staticmethod
    def skip_weight(name: str) -> bool:
        return name.endswith("position_ids") or name.startswith("pooler.")

    @staticmethod
    def build_classifier(config, num_labels: int, names: set[str]) -> nn.Module:
        from vllm.model_executor.models.adapters import TokenClassifierHead
        return TokenClassifierHead(config.hidden_size, num_labels)


class BertForTokenClassification(TokenClassifierMixin, BertModel):
    """BERT for token classification."""
