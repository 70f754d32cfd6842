"""Where a PEFT adapter's module lands in our model.

PEFT names modules as Transformers does (`q_proj`, `attention.self.query`, `Wqkv`); our
backbones fuse some of them (`qkv_proj`, `gate_up_proj`, BERT's `qkv`) and store query /
key rows with rotary pairs interleaved. A `Target` says which of our `Linear` layers a
PEFT module is, which rows of its output it owns, and how to reorder its `lora_B` rows
the way the loader reordered the base weight.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from vllm.model_executor.layers.linear import Linear
from vllm.model_executor.layers.rotary import interleave_halves

_WRAPPER = "base_model.model."


@dataclass
class Target:
    path: str                 # our module path inside the backbone
    layer: Linear
    offset: int               # first output row of the PEFT module inside `layer`
    rows: int                 # its output rows
    reorder: Optional[Callable[[torch.Tensor], torch.Tensor]] = None  # on lora_B rows


def split_tensor_name(name: str) -> tuple[str, str]:
    """'base_model.model.X.lora_A.weight' -> ('X', 'A'); a full tensor of a saved module
    ('base_model.model.classifier.weight') -> ('classifier.weight', 'full'); a saved copy
    of a base weight -> (name, 'base'), which is ignored as upstream does."""
    if name.startswith(_WRAPPER):
        name = name[len(_WRAPPER):]
    for kind in ("A", "B"):
        for marker in (f".lora_{kind}.weight", f".lora_{kind}.default.weight"):
            if name.endswith(marker):
                return name[: -len(marker)], kind
    if ".base_layer." in name:
        return name, "base"  # PEFT's copy of a base embedding weight (save_embedding_layers)
    if ".lora_embedding_" in name or ".lora_magnitude_vector" in name:
        raise ValueError(f"LoRA tensor {name!r} is not supported: only lora_A / lora_B of "
                         "linear projections (no embedding LoRA, no DoRA).")
    return name.replace(".modules_to_save.default.", "."), "full"


def strip_prefix(backbone: nn.Module, module: str) -> str:
    """PEFT's module name relative to the backbone: adapters trained on the bare model
    (`layers.0...`) and on its task class (`model.layers.0...`) both resolve."""
    prefix = getattr(backbone, "weight_prefix", "")
    return module[len(prefix):] if prefix and module.startswith(prefix) else module


def locate(backbone: nn.Module, module: str) -> Target:
    """The `Target` of a PEFT module name (already relative to the backbone)."""
    from vllm.model_executor.models.decoder import DecoderModel
    from vllm.model_executor.models.modernbert import ModernBertModel
    check_supported(backbone)
    family = _decoder if isinstance(backbone, DecoderModel) else \
        _modernbert if isinstance(backbone, ModernBertModel) else _bert
    try:
        return family(backbone, module)
    except (AttributeError, KeyError, ValueError):
        raise ValueError(f"The LoRA adapter targets {module!r}, which is not a projection "
                         f"of {type(backbone).__name__}; adapters may target the attention "
                         "and MLP linear layers only.") from None


def _whole(backbone: nn.Module, path: str, reorder=None) -> Target:
    layer = _linear(backbone, path)
    return Target(path, layer, 0, layer.out_features, reorder)


def _linear(backbone: nn.Module, path: str) -> Linear:
    layer = backbone.get_submodule(path)
    if not isinstance(layer, Linear):
        raise AttributeError(path)
    return layer


def _decoder(backbone: nn.Module, module: str) -> Target:
    from vllm.model_executor.models.decoder import _FUSED
    parent, _, leaf = module.rpartition(".")
    if leaf not in _FUSED:
        return _whole(backbone, module)
    fused, shard = _FUSED[leaf]
    path = f"{parent}.{fused}"
    sizes = backbone.get_submodule(parent).shard_sizes
    head_dim = backbone.layers[0].self_attn.head_dim
    reorder = (lambda b: interleave_halves(b, head_dim)) if leaf in ("q_proj", "k_proj") \
        else None
    return Target(path, _linear(backbone, path), sum(sizes[:shard]), sizes[shard], reorder)


def _bert(backbone: nn.Module, module: str) -> Target:
    from vllm.model_executor.models.bert import _map_bert_name
    pname, shard = _map_bert_name(module + ".weight")
    path = pname[: -len(".weight")]
    if shard is None:
        return _whole(backbone, path)
    h = backbone.config.hidden_size
    return Target(path, _linear(backbone, path), shard * h, h)


def _modernbert(backbone: nn.Module, module: str) -> Target:
    if not module.endswith("attn.Wqkv"):
        return _whole(backbone, module)
    h = backbone.config.hidden_size
    head_dim = h // backbone.config.num_attention_heads

    def reorder(b: torch.Tensor) -> torch.Tensor:
        return torch.cat([interleave_halves(b[:h], head_dim),
                          interleave_halves(b[h:2 * h], head_dim), b[2 * h:]])
    return _whole(backbone, module, reorder)


def check_supported(backbone: nn.Module) -> None:
    """A ValueError at start-up for a backbone adapters cannot target."""
    from vllm.model_executor.models.bert import BertModel
    from vllm.model_executor.models.decoder import DecoderModel
    from vllm.model_executor.models.modernbert import ModernBertModel
    if not isinstance(backbone, (DecoderModel, BertModel, ModernBertModel)):
        raise ValueError(f"enable_lora: LoRA adapters are not supported on "
                         f"{type(backbone).__name__}; they are on the Llama/Qwen2/Qwen3/Gemma "
                         "decoders and the BERT, RoBERTa, XLM-R and ModernBERT encoders.")
