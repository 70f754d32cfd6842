"""Alibaba's GTE "new" encoder (gte-multilingual-base, gte-base/large-en-v1.5,
snowflake-arctic-embed-m-v2.0) and its reranker (gte-multilingual-reranker-base).

A post-norm BERT with rotary positions (NTK-scaled where `rope_scaling` says so), a GeGLU
MLP whose fused `up_gate_proj` has no bias, and biases everywhere else. Upstream serves
the remote code's `NewModel` as `GteNewModel` (`hf_overrides={"architectures":
["GteNewModel"]}`), its `NewForSequenceClassification` as
`GteNewForSequenceClassification`, and arctic-embed-m-v2.0's `GteModel` with the same code;
all default to CLS pooling. Tensor names are the remote code's (`encoder.layer.N.attention.
qkv_proj`, `attn_ln`, `mlp.up_gate_proj` = [up; gate], `mlp_ln`; the reranker under `new.`)
or transformers 5's own Gte layout (`layers.N.self_attn.q_proj`, ...).
"""
from __future__ import annotations

from typing import Iterator, Optional

import torch
from torch import nn

from vllm.model_executor.layers.rotary import rope_parameters
from vllm.model_executor.lora_target import LoRATarget, whole
from vllm.model_executor.models.bert import BertClassifierHead
from vllm.model_executor.models.rope_encoder import (TRANSFORMERS_LAYER_NAMES, EncoderSpec,
                                                     RopeEncoderModel)

# hidden_act -> the GLU gate's activation (layers/linear.py names)
_GATED = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
          "relu": "relu", "silu": "silu"}

_GTE_LAYER_NAMES: dict[str, tuple[str, Optional[int]]] = {
    "attention.qkv_proj": ("qkv", None), "attention.o_proj": ("attn_out", None),
    "attn_ln": ("attn_norm", None), "mlp.gate_proj": ("gate_up", 0),
    "mlp.up_proj": ("gate_up", 1), "mlp.down_proj": ("down", None), "mlp_ln": ("mlp_norm", None),
}


def _rope(config, head_dim: int) -> dict:
    """rotary.py's parameters. The remote code's fixed NTK scaling by `factor` f is the
    base theta * f with every frequency divided by f ** (2 / head_dim): exactly rotary.py's
    "linear" type on that base with factor f ** (2 / head_dim)."""
    rope = rope_parameters(config)
    if rope["rope_type"] != "ntk":
        return rope
    if rope.get("mixed_b") is not None:
        raise ValueError("GTE: rope_scaling with mixed_b (mixed NTK) is not supported.")
    factor = float(rope["factor"])
    return {"rope_type": "linear", "rope_theta": float(rope["rope_theta"]) * factor,
            "factor": factor ** (2.0 / head_dim)}


def _refuse_unsupported(config, head_dim: int) -> None:
    checks = [
        (getattr(config, "position_embedding_type", "rope") not in (None, "rope", "rotary"),
         "position_embedding_type other than rope"),
        (getattr(config, "layer_norm_type", "layer_norm") not in (None, "layer_norm"),
         "layer_norm_type other than layer_norm"),
        (bool(getattr(config, "logn_attention_scale", False)), "logn_attention_scale=true"),
        (getattr(config, "rotary_emb_dim", None) not in (None, head_dim),
         "rotary_emb_dim < head size (partial rotary)"),
        (getattr(config, "hidden_act", "gelu") not in _GATED,
         f"hidden_act {getattr(config, 'hidden_act', None)!r}"),
    ]
    bad = [what for failed, what in checks if failed]
    if bad:
        raise ValueError(f"GTE: {', '.join(bad)} is not supported by the native "
                         "implementation.")


def gte_spec(config) -> EncoderSpec:
    h, heads = int(config.hidden_size), int(config.num_attention_heads)
    _refuse_unsupported(config, h // heads)
    return EncoderSpec(
        vocab_size=int(config.vocab_size), hidden_size=h,
        num_layers=int(config.num_hidden_layers), num_heads=heads,
        intermediate_size=int(config.intermediate_size),
        type_vocab_size=int(getattr(config, "type_vocab_size", 0) or 0),
        eps=float(getattr(config, "layer_norm_eps", 1e-12)),
        attn_bias=True, gate_up_bias=False, down_bias=True,
        activation=_GATED[getattr(config, "hidden_act", "gelu")], rope=_rope(config, h // heads),
        max_positions=max(int(getattr(config, "max_position_embeddings", 0) or 0), 512))


class GteNewModel(RopeEncoderModel):
    """The GTE "new" encoder (also served for `GteModel`); CLS pooling by default."""

    weight_prefix = "new."
    layer_prefixes = ("encoder.layer.", "layers.")
    layer_names = {**TRANSFORMERS_LAYER_NAMES, **_GTE_LAYER_NAMES}

    @staticmethod
    def spec_of(config) -> EncoderSpec:
        return gte_spec(config)

    def expand(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """`mlp.up_gate_proj` stacks [up; gate]: two tensors, as `map_name` knows them."""
        if ".mlp.up_gate_proj." in name:
            up, gate = tensor.chunk(2, dim=0)
            yield name.replace("up_gate_proj", "up_proj"), up
            yield name.replace("up_gate_proj", "gate_proj"), gate
        else:
            yield name, tensor

    def lora_target(self, module: str) -> LoRATarget:
        """`up_gate_proj` is all of our `gate_up`, whose halves are in the other order."""
        if not module.endswith("mlp.up_gate_proj"):
            return super().lora_target(module)
        path = self.map_name(module.replace("up_gate_proj", "up_proj") + ".weight")[0]
        i = self.spec.intermediate_size
        return whole(self, path[: -len(".weight")], lambda b: torch.cat([b[i:], b[:i]]))


class GteNewForSequenceClassification(GteNewModel):
    """gte-multilingual-reranker-base: the encoder, BERT's pooler (dense + tanh on the CLS
    state) and a linear classifier; tensors `new.pooler.dense.*` and `classifier.*`."""

    @staticmethod
    def skip_weight(name: str) -> bool:
        return name.endswith(("position_ids", "inv_freq"))

    @staticmethod
    def build_classifier(config, num_labels: int, names: set[str]) -> nn.Module:
        return BertClassifierHead(config, num_labels)
