"""ModernBERT encoder (bidirectional) and its sequence-classification head.

Pre-norm layers whose attention alternates between global and local (a window of
`local_attention // 2` tokens on each side) as `layer_types` says (older configs:
every `global_attn_every_n_layers`-th layer is global), each kind with its own rope
theta, and a GeGLU MLP. Module names equal Hugging Face's, so checkpoints load by name.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import GatedLinear, Linear, mlp_add
from vllm.model_executor.layers.rotary import RotaryEmbedding, apply_rotary, interleave_halves
from vllm.model_executor.lora_target import LoRATarget, whole
from vllm.model_executor.weight_utils import copy_param

_ACTS = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
         "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu,
         "silu": F.silu}
# hidden_activation -> the name `GatedLinear` fuses (layers/linear.py's activations)
_GATED_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "relu": "relu", "silu": "silu"}


def _act(name: str):
    if name not in _ACTS:
        raise ValueError(f"activation {name!r} is not supported (supported: {', '.join(_ACTS)})")
    return _ACTS[name]


def layer_types(config) -> list[str]:
    """'full_attention' / 'sliding_attention' per layer."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    every = getattr(config, "global_attn_every_n_layers", 3)
    return ["sliding_attention" if i % every else "full_attention"
            for i in range(config.num_hidden_layers)]


def _rope(config, kind: str) -> dict:
    params = dict((getattr(config, "rope_parameters", None) or {}).get(kind) or {})
    default = {"full_attention": getattr(config, "global_rope_theta", 160000.0),
               "sliding_attention": getattr(config, "local_rope_theta", 10000.0)}[kind]
    params.setdefault("rope_theta", default)
    params["rope_type"] = params.get("rope_type") or "default"
    return params


def _norm(config) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps,
                        bias=getattr(config, "norm_bias", False))


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.norm = _norm(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))


class ModernBertAttention(nn.Module):
    def __init__(self, config, sliding: bool) -> None:
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = h // self.num_heads
        bias = getattr(config, "attention_bias", False)
        self.Wqkv = Linear(h, 3 * h, bias=bias)
        self.Wo = Linear(h, h, bias=bias)
        half = config.local_attention // 2
        self.attn = Attention(self.num_heads, self.head_dim, self.num_heads,
                              window=(half, half) if sliding else None)

    def forward(self, x: torch.Tensor, rotation: torch.Tensor, meta: AttentionMetadata,
                residual: torch.Tensor, rows: Optional[torch.Tensor]) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.Wqkv(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = apply_rotary(q, rotation), apply_rotary(k, rotation)
        out = self.attn(q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1), meta)
        return self.Wo.forward_add(out if rows is None else out[rows], residual)


class ModernBertMLP(nn.Module):
    """GeGLU: Wo(act(x Wi_in) * (x Wi_gate)). Without bias, Wi is a `GatedLinear` whose
    GEMMs apply the activation and the product in their epilogues (no separate passes)."""

    def __init__(self, config) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        bias = getattr(config, "mlp_bias", False)
        act = _GATED_ACTS.get(config.hidden_activation)
        self.Wi = GatedLinear(h, i, act) if act and not bias else Linear(h, 2 * i, bias=bias)
        self.Wo = Linear(i, h, bias=bias)
        self.act = _act(config.hidden_activation)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if isinstance(self.Wi, GatedLinear):
            return mlp_add(self.Wi, self.Wo, x, residual)
        inp, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo.forward_add(self.act(inp) * gate, residual)


class ModernBertLayer(nn.Module):
    def __init__(self, config, index: int, kind: str) -> None:
        super().__init__()
        self.attn_norm = nn.Identity() if index == 0 else _norm(config)
        self.attn = ModernBertAttention(config, kind == "sliding_attention")
        self.mlp_norm = _norm(config)
        self.mlp = ModernBertMLP(config)
        self.kind = kind

    def forward(self, x: torch.Tensor, rotation: torch.Tensor, meta: AttentionMetadata,
                rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        residual = x if rows is None else x[rows]
        x = self.attn(self.attn_norm(x), rotation, meta, residual, rows)
        return self.mlp(self.mlp_norm(x), x)


class ModernBertModel(nn.Module):
    """forward(input_ids[T], positions[T], meta) -> hidden_states[T, H] (final norm applied;
    only the `meta.output_rows` rows when those are given)."""

    default_pooling_type = "CLS"
    is_causal = False
    weight_prefix = "model."

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        kinds = layer_types(config)
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertLayer(config, i, kind)
                                    for i, kind in enumerate(kinds))
        self.final_norm = _norm(config)
        head_dim = config.hidden_size // config.num_attention_heads
        self.rotary = {kind: RotaryEmbedding(head_dim, config.max_position_embeddings,
                                             _rope(config, kind)) for kind in set(kinds)}


    def lora_target(self, module: str) -> LoRATarget:
        """Where PEFT's `module` lands: `Wqkv` whole, its query and key rows with rotary
        pairs interleaved as the loader stored them."""
        if not module.endswith("attn.Wqkv"):
            return whole(self, module)
        h = self.config.hidden_size
        head_dim = h // self.config.num_attention_heads

        def reorder(b: torch.Tensor) -> torch.Tensor:
            return torch.cat([interleave_halves(b[:h], head_dim),
                              interleave_halves(b[h:2 * h], head_dim), b[2 * h:]])
        return whole(self, module, reorder)
    def attention_layers(self) -> list[Attention]:
        return [layer.attn.attn for layer in self.layers]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata,
                token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.embeddings(input_ids)
        rotations = {kind: r.rotations(positions) for kind, r in self.rotary.items()}
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, rotations[layer.kind], meta, meta.output_rows if i == last else None)
        return self.final_norm(x)

    @staticmethod
    def skip_weight(name: str) -> bool:
        """The MLM / classification heads of a checkpoint served as an embedder."""
        return name.startswith(("head.", "decoder.")) or "inv_freq" in name

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load by HF name; the query/key rows of Wqkv are reordered for the complex
        rotary (`rotary.interleave_halves`)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        h = self.config.hidden_size
        head_dim = h // self.config.num_attention_heads
        for name, tensor in weights:
            if name not in params:
                raise ValueError(f"checkpoint weight {name!r} has no place in "
                                 f"{type(self).__name__}")
            if name.endswith("attn.Wqkv.weight") or name.endswith("attn.Wqkv.bias"):
                tensor = torch.cat([interleave_halves(tensor[:h], head_dim),
                                    interleave_halves(tensor[h:2 * h], head_dim), tensor[2 * h:]])
            copy_param(params[name], tensor, name)
            loaded.add(name)
        return loaded


class ModernBertClassifierHead(nn.Module):
    """head (dense -> activation -> LayerNorm) then classifier, on the pooled state (CLS or
    MEAN, from `classifier_pooling`). Parameter names equal the checkpoint's."""

    def __init__(self, config, num_labels: int) -> None:
        super().__init__()
        self.head = _PredictionHead(config)
        self.classifier = nn.Linear(config.hidden_size, num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.head(pooled))

    def per_token(self, hidden: torch.Tensor) -> torch.Tensor:
        """`token_classify` on the sequence classifier: the classifier alone on every
        token (the head's dense/norm belong to the pooled summary, as upstream)."""
        return self.classifier(hidden)


class _PredictionHead(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        h = config.hidden_size
        self.dense = nn.Linear(h, h, bias=getattr(config, "classifier_bias", False))
        self.act = _act(getattr(config, "classifier_activation", "gelu"))
        self.norm = _norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class ModernBertForSequenceClassification(ModernBertModel):
    @staticmethod
    def skip_weight(name: str) -> bool:
        return name.startswith("decoder.") or "inv_freq" in name

    @staticmethod
    def build_classifier(config, num_labels: int, names: set[str]) -> nn.Module:
        return ModernBertClassifierHead(config, num_labels)


class ModernBertForTokenClassification(ModernBertModel):
    """ModernBERT with head (dense -> act -> norm) + classifier on every token (NER)."""

    @staticmethod
    def skip_weight(name: str) -> bool:
        return name.startswith("decoder.") or "inv_freq" in name

    @staticmethod
    def build_classifier(config, num_labels: int, names: set[str]) -> nn.Module:
        return _TokenHead(config, num_labels)


class _TokenHead(ModernBertClassifierHead):
    """The token classifier applies head and classifier to every token."""

    def per_token(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.forward(hidden)
