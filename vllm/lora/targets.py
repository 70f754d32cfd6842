"""Where a PEFT adapter's module lands in our model: each backbone that adapters may target
declares `lora_target(module)` (vllm.model_executor.lora_target), which says which of its
`Linear` layers a PEFT module is, which rows of that layer's output it owns, and how to
reorder its `lora_B` rows the way the loader reordered the base weight.
"""
from __future__ import annotations

from torch import nn

from vllm.model_executor.lora_target import LoRATarget as Target, UnsupportedTarget

_WRAPPER = "base_model.model."


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
    check_supported(backbone)
    try:
        return backbone.lora_target(module)
    except UnsupportedTarget:
        raise  # the backbone's own refusal names the module and why
    except (AttributeError, KeyError, ValueError):
        raise ValueError(f"The LoRA adapter targets {module!r}, which is not a projection "
                         f"of {type(backbone).__name__}; adapters may target the attention "
                         "and MLP linear layers only.") from None


def check_supported(backbone: nn.Module) -> None:
    """A ValueError at start-up for a backbone adapters cannot target (one that declares no
    `lora_target`)."""
    if not callable(getattr(backbone, "lora_target", None)):
        raise ValueError(f"enable_lora: LoRA adapters are not supported on "
                         f"{type(backbone).__name__}; they are on the Llama/Qwen2/Qwen3/Gemma "
                         "decoders, the BERT, RoBERTa, XLM-R and ModernBERT encoders and "
                         "the Transformers backend.")


def prepare(backbone: nn.Module) -> None:
    """Once, when LoRA is enabled: refuse a backbone adapters cannot target, and let one
    that declares `prepare_lora` get its projections ready."""
    check_supported(backbone)
    hook = getattr(backbone, "prepare_lora", None)
    if callable(hook):
        hook()
