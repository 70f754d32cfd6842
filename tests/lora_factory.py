"""Tiny seeded PEFT LoRA adapters for the tests, and their two references.

`make_adapter` wraps a checkpoint of `model_factory` in PEFT (`LoraConfig`,
`get_peft_model`), gives every `lora_A` / `lora_B` seeded values (PEFT starts B at zero,
which would make the adapter a no-op) and saves it (`adapter_config.json` +
`adapter_model.safetensors`). References: the PEFT model itself (`peft_model`), and the
base model with `W + scale * B @ A` merged by hand (`merged_model`); both in float32.
"""
from __future__ import annotations

import functools
import json
import math
import pathlib
from typing import Optional, Sequence

import torch

_CLASSES = {"base": "AutoModel", "causal": "AutoModelForCausalLM",
            "seqcls": "AutoModelForSequenceClassification"}


def _load(base_dir, kind: str):
    import transformers
    cls = getattr(transformers, _CLASSES[kind])
    return cls.from_pretrained(str(base_dir), dtype=torch.float32,
                               attn_implementation="eager").eval()


def make_adapter(base_dir, out_dir, *, kind: str = "base", r: int = 4, alpha: float = 8,
                 targets: Sequence[str] = ("q_proj", "v_proj"), seed: int = 0,
                 use_rslora: bool = False, modules_to_save: Optional[list[str]] = None,
                 std: float = 0.2, config_edits: Optional[dict] = None,
                 **lora_kwargs) -> str:
    """Save a seeded adapter for `base_dir` (trained on the `kind` class) into `out_dir`."""
    from peft import LoraConfig, get_peft_model
    model = _load(base_dir, kind)
    cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0,
                     use_rslora=use_rslora, modules_to_save=modules_to_save,
                     **lora_kwargs)
    peft_model = get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    out = pathlib.Path(out_dir)
    peft_model.save_pretrained(str(out))
    if config_edits:
        file = out / "adapter_config.json"
        data = json.loads(file.read_text())
        data.update(config_edits)
        file.write_text(json.dumps(data))
    return str(out)


@functools.lru_cache(maxsize=None)
def peft_model(base_dir: str, adapter_dir: str, kind: str):
    """The PEFT model (base + adapter, unmerged) in float32."""
    from peft import PeftModel
    return PeftModel.from_pretrained(_load(base_dir, kind), adapter_dir).eval()


@functools.lru_cache(maxsize=None)
def merged_model(base_dir: str, adapter_dir: str, kind: str):
    """The base model with W + (alpha / r) * B @ A written into each target by hand."""
    from safetensors.torch import load_file
    cfg = json.loads((pathlib.Path(adapter_dir) / "adapter_config.json").read_text())
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / (math.sqrt(r) if cfg.get("use_rslora") else r)
    model = _load(base_dir, kind)
    modules = dict(model.named_modules())
    tensors = load_file(str(pathlib.Path(adapter_dir) / "adapter_model.safetensors"))
    with torch.no_grad():
        for name, a in tensors.items():
            if ".lora_A." not in name:
                continue
            module = name.split(".lora_A.")[0].removeprefix("base_model.model.")
            b = tensors[name.replace(".lora_A.", ".lora_B.")]
            modules[module].weight += scale * (b @ a)
        for name, t in tensors.items():
            if "lora_" not in name:
                module, _, param = name.removeprefix("base_model.model.").rpartition(".")
                getattr(modules[module], param).copy_(t)
    return model


def run(model, token_ids: Sequence[int], bidirectional: bool = False) -> torch.Tensor:
    """Last hidden states [T, H] (base / causal kinds) or logits [L] (seqcls)."""
    ids = torch.tensor([list(token_ids)])
    kwargs = {"attention_mask": torch.ones(1, 1, len(ids[0]), len(ids[0]), dtype=torch.bool)} \
        if bidirectional else {}
    with torch.inference_mode():
        out = model(input_ids=ids, output_hidden_states=True, **kwargs)
    if hasattr(out, "logits") and out.logits.dim() == 2:
        return out.logits[0].float()
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state[0].float()
    return out.hidden_states[-1][0].float()
