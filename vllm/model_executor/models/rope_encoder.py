"""Post-norm BERT-shaped encoders with rotary positions and a gated MLP: the common body of
NomicBERT (`nomic_bert.py`) and Alibaba's GTE "new" architecture (`gte.py`); jina's rotary
XLM-R (`jina_roberta.py`) takes it with a plain MLP (`EncoderSpec.gated` false).

embeddings = LayerNorm(word + token type) (no absolute positions), then per layer
    x = attn_norm(x + attn_out(attention(rope(q), rope(k), v)))
    x = mlp_norm(x + down(act(gate(x)) * up(x)))
The families differ only in their config keys, biases, gate activation and checkpoint
names: each describes itself with an `EncoderSpec` and a table of checkpoint names.
Query/key rows are stored with rotary pairs interleaved (`rotary.interleave_halves`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import torch
from torch import nn

from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import (GatedLinear, Linear, apply_activation,
                                               mlp_add)
from vllm.model_executor.layers.rotary import RotaryEmbedding, apply_rotary, interleave_halves
from vllm.model_executor.lora_target import LoRATarget, linear_at, whole
from vllm.model_executor.weight_utils import copy_param, copy_shard

# Layer sub-modules as transformers 5 names them in its own NomicBert / Gte classes:
# our module and, for a slice of a fused one, its shard (qkv: q/k/v; gate_up: gate/up).
TRANSFORMERS_LAYER_NAMES: dict[str, tuple[str, Optional[int]]] = {
    "self_attn.q_proj": ("qkv", 0), "self_attn.k_proj": ("qkv", 1),
    "self_attn.v_proj": ("qkv", 2), "self_attn.o_proj": ("attn_out", None),
    "post_attention_layernorm": ("attn_norm", None), "mlp.gate_proj": ("gate_up", 0),
    "mlp.up_proj": ("gate_up", 1), "mlp.down_proj": ("down", None),
    "post_mlp_layernorm": ("mlp_norm", None),
}


@dataclass(frozen=True)
class EncoderSpec:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    type_vocab_size: int   # 0: no token-type embeddings (gte-base-en-v1.5)
    eps: float
    attn_bias: bool        # the qkv and attention-output projections
    gate_up_bias: bool
    down_bias: bool
    activation: str        # the gate's: silu (SwiGLU), gelu (GeGLU); layers/linear.py names
    rope: dict             # rotary.py's parameters (rope_type, rope_theta, ...)
    max_positions: int
    gated: bool = True     # False: a plain MLP, down(act(up(x))) (jina's XLM-R)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class RopeEncoderEmbeddings(nn.Module):
    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        h = spec.hidden_size
        self.word_embeddings = nn.Embedding(spec.vocab_size, h)
        self.token_type_embeddings = nn.Embedding(spec.type_vocab_size, h) \
            if spec.type_vocab_size > 0 else None
        self.LayerNorm = nn.LayerNorm(h, eps=spec.eps)
        # Per-row LoRA on the tables (vllm.lora.task_adapters.EmbeddingLoRA), set from
        # above where the checkpoint carries task adapters: `add(ids, rows) -> rows`.
        self.word_lora = None
        self.type_lora = None

    def forward(self, input_ids: torch.Tensor,
                token_type_ids: Optional[torch.Tensor]) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if self.word_lora is not None:
            x = self.word_lora.add(input_ids, x)
        types = self.token_type_embeddings
        if types is not None and self.type_lora is not None:
            ids = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            x = x + self.type_lora.add(ids, types(ids))
        elif types is not None:
            x = x + (types.weight[0] if token_type_ids is None else types(token_type_ids))
        return self.LayerNorm(x)


class RopeEncoderLayer(nn.Module):
    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        h, i = spec.hidden_size, spec.intermediate_size
        self.num_heads, self.head_dim = spec.num_heads, spec.head_dim
        self.qkv = Linear(h, 3 * h, bias=spec.attn_bias)
        self.attn = Attention(self.num_heads, self.head_dim, self.num_heads)
        self.attn_out = Linear(h, h, bias=spec.attn_bias)
        self.attn_norm = nn.LayerNorm(h, eps=spec.eps)
        # Without a bias the GEMM's epilogue applies the activation and the product.
        if spec.gated:
            self.gate_up = Linear(h, 2 * i, bias=True) if spec.gate_up_bias \
                else GatedLinear(h, i, spec.activation)
        else:
            self.up = Linear(h, i, bias=spec.gate_up_bias, activation=spec.activation)
        self.gated = spec.gated
        self.activation = spec.activation
        self.down = Linear(i, h, bias=spec.down_bias)
        self.mlp_norm = nn.LayerNorm(h, eps=spec.eps)

    def forward(self, x: torch.Tensor, rotation: torch.Tensor, meta: AttentionMetadata,
                rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`rows`: keep only these rows after attention (the last layer under CLS/LAST)."""
        t = x.shape[0]
        q, k, v = self.qkv(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = apply_rotary(q, rotation), apply_rotary(k, rotation)
        out = self.attn(q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1), meta)
        if rows is not None:
            x, out = x[rows], out[rows]
        x = self.attn_out.forward_add_norm(out, x, self.attn_norm)
        if not self.gated or isinstance(self.gate_up, GatedLinear):
            return mlp_add(self.gate_up if self.gated else self.up, self.down, x, x,
                           self.mlp_norm)
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        hidden = apply_activation(self.activation, gate) * up
        return self.down.forward_add_norm(hidden, x, self.mlp_norm)


class RopeEncoderModel(nn.Module):
    """forward(input_ids[T], positions[T], meta, token_type_ids) -> hidden_states[T, H]
    (only the `meta.output_rows` rows when those are given). A family subclass sets
    `spec_of` and its checkpoint names: `layer_prefixes` (where layer i's tensors sit),
    `layer_names` (their sub-modules -> ours, with the shard of a fused one) and
    `top_names` (the rest)."""

    default_pooling_type = "CLS"
    is_causal = False
    weight_prefix = ""
    layer_prefixes: tuple[str, ...] = ("layers.",)
    layer_names: dict[str, tuple[str, Optional[int]]] = TRANSFORMERS_LAYER_NAMES
    top_names: dict[str, str] = {}

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.spec = spec = self.spec_of(config)
        # Other readers of the HF config (pooling widths, heads) see the real sizes, not
        # the defaults transformers' NomicBertConfig keeps beside nomic's own keys.
        for key, value in (("hidden_size", spec.hidden_size), ("num_hidden_layers",
                           spec.num_layers), ("num_attention_heads", spec.num_heads),
                           ("intermediate_size", spec.intermediate_size),
                           ("head_dim", spec.head_dim)):
            setattr(config, key, value)
        self.embeddings = RopeEncoderEmbeddings(spec)
        self.layers = nn.ModuleList(RopeEncoderLayer(spec) for _ in range(spec.num_layers))
        self.rotary = RotaryEmbedding(spec.head_dim, spec.max_positions, spec.rope)

    @staticmethod
    def spec_of(config) -> EncoderSpec:
        raise NotImplementedError

    def attention_layers(self) -> list[Attention]:
        return [layer.attn for layer in self.layers]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata,
                token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.embeddings(input_ids, token_type_ids)
        rotation = self.rotary.rotations(positions)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, rotation, meta, meta.output_rows if i == last else None)
        return x

    @staticmethod
    def skip_weight(name: str) -> bool:
        """Buffers and the unused BERT pooler of an embedding checkpoint."""
        return name.endswith(("position_ids", "inv_freq")) or name.startswith("pooler.")

    # ----- checkpoint names -------------------------------------------------------------
    def map_name(self, name: str) -> tuple[str, Optional[int]]:
        """(our parameter, the shard of a fused one or None) for a checkpoint tensor."""
        module, kind = name.rsplit(".", 1)
        for prefix in self.layer_prefixes:
            if name.startswith(prefix):
                idx, sub = module[len(prefix):].split(".", 1)
                ours, shard = self.layer_names.get(sub, (sub, None))
                return f"layers.{idx}.{ours}.{kind}", shard
        return f"{self.top_names.get(module, module)}.{kind}", None

    def expand(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """A checkpoint tensor as the tensors `map_name` knows (a family may split one)."""
        yield name, tensor

    def _qk_interleaved(self, tensor: torch.Tensor, shard: Optional[int]) -> torch.Tensor:
        d, h = self.spec.head_dim, self.spec.hidden_size
        if shard is not None:
            return interleave_halves(tensor, d) if shard < 2 else tensor
        return torch.cat([interleave_halves(tensor[:h], d),
                          interleave_halves(tensor[h:2 * h], d), tensor[2 * h:]])

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        h, i = self.spec.hidden_size, self.spec.intermediate_size
        loaded: set[str] = set()
        shards: dict[str, set[int]] = {}
        for name, tensor in weights:
            for sub_name, sub in self.expand(name, tensor):
                ours, shard = self.map_name(sub_name)
                if ours not in params:
                    raise ValueError(f"checkpoint weight {name!r} has no place in "
                                     f"{type(self).__name__}")
                if ".qkv." in ours:
                    sub = self._qk_interleaved(sub, shard)
                if shard is None:
                    copy_param(params[ours], sub, name)
                    loaded.add(ours)
                    continue
                sizes = [h, h, h] if ".qkv." in ours else [i, i]
                copy_shard(params[ours], sizes, shard, sub)
                shards.setdefault(ours, set()).add(shard)
                if len(shards[ours]) == len(sizes):
                    loaded.add(ours)
        return loaded

    def lora_target(self, module: str) -> LoRATarget:
        """Where PEFT's `module` (a checkpoint name) lands: our projection whole or its
        shard, query/key rows interleaved as the loader stored them."""
        ours, shard = self.map_name(module + ".weight")
        path = ours[: -len(".weight")]
        fused_qkv = path.endswith(".qkv")
        if shard is None:
            return whole(self, path, (lambda b: self._qk_interleaved(b, None))
                         if fused_qkv else None)
        rows = self.spec.hidden_size if fused_qkv else self.spec.intermediate_size
        reorder = (lambda b: self._qk_interleaved(b, shard)) if fused_qkv else None
        return LoRATarget(path, linear_at(self, path), shard * rows, rows, reorder)
