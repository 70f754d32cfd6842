"""Where a PEFT LoRA module lands in one of our backbones (`LoRATarget`).

PEFT names modules as Transformers does (`q_proj`, `attention.self.query`, `Wqkv`); our
backbones fuse some of them (`qkv_proj`, `gate_up_proj`, BERT's `qkv`) and store query /
key rows with rotary pairs interleaved. A backbone that adapters may target declares
`lora_target(module) -> LoRATarget` (vllm.lora calls it); one without it refuses LoRA.
A backbone may also declare `prepare_lora()`, called once when the engine enables LoRA
(the Transformers backend makes its `nn.Linear` projections LoRA-capable then).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from vllm.model_executor.layers.linear import Linear


class UnsupportedTarget(ValueError):
    """A module the adapter names that this backbone cannot take LoRA on; its message is
    the refusal shown to the user as is."""


@dataclass
class LoRATarget:
    path: str                 # our module path inside the backbone
    layer: Linear
    offset: int               # first output row of the PEFT module inside `layer`
    rows: int                 # its output rows
    reorder: Optional[Callable[[torch.Tensor], torch.Tensor]] = None  # on lora_B rows


def linear_at(backbone: nn.Module, path: str) -> Linear:
    """The `Linear` at `path` (AttributeError where there is none)."""
    layer = backbone.get_submodule(path)
    if not isinstance(layer, Linear):
        raise AttributeError(path)
    return layer


def whole(backbone: nn.Module, path: str, reorder=None) -> LoRATarget:
    """A PEFT module that is all of our `Linear` at `path`."""
    layer = linear_at(backbone, path)
    return LoRATarget(path, layer, 0, layer.out_features, reorder)
