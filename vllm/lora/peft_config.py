"""A PEFT LoRA adapter's `adapter_config.json`: rank, scaling, and what we refuse.

Scaling is PEFT's: `lora_alpha / r`, or `lora_alpha / sqrt(r)` with `use_rslora`;
`rank_pattern` / `alpha_pattern` override both per module (a key matches a module whose
name ends with it, at a dot boundary, as PEFT matches them).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

# The task heads an adapter may replace whole (PEFT's `modules_to_save`).
HEAD_MODULES = ("classifier", "score")
_PLAIN_INITS = ("gaussian", "eva", "orthogonal", "mica", "lora_ga")


class AdapterNotFoundError(ValueError):
    """The adapter directory has no adapter_config.json or adapter weights."""


@dataclass
class PeftConfig:
    r: int
    lora_alpha: float
    target_modules: Any = None
    use_rslora: bool = False
    modules_to_save: list[str] = field(default_factory=list)
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dir(cls, path: str) -> "PeftConfig":
        """Read `path/adapter_config.json` (a ValueError naming what is missing)."""
        file = Path(path) / "adapter_config.json"
        if not file.is_file():
            raise AdapterNotFoundError(f"No adapter_config.json in LoRA adapter directory "
                                       f"{path!r}.")
        raw = json.loads(file.read_text())
        missing = [k for k in ("r", "lora_alpha") if k not in raw]
        if missing:
            raise ValueError(f"Missing required configuration fields: {set(missing)} "
                             f"(in {file}).")
        if not isinstance(raw["r"], int) or raw["r"] <= 0:
            raise ValueError(f"LoRA rank `r` must be a positive integer, got {raw['r']!r}.")
        return cls(raw["r"], float(raw["lora_alpha"]), raw.get("target_modules"),
                   bool(raw.get("use_rslora")), list(raw.get("modules_to_save") or []),
                   dict(raw.get("rank_pattern") or {}), dict(raw.get("alpha_pattern") or {}),
                   raw)

    @property
    def max_rank(self) -> int:
        return max([self.r, *self.rank_pattern.values()])

    def validate(self, max_lora_rank: int) -> None:
        """Refuse what this engine (like upstream) cannot run, every reason in one error."""
        errors = self._unsupported()
        if self.max_rank > max_lora_rank:
            errors.append(f"LoRA rank {self.max_rank} is greater than max_lora_rank "
                          f"{max_lora_rank}.")
        if errors:
            raise ValueError(" ".join(errors))

    def _unsupported(self) -> list[str]:
        raw, errors = self.raw, []
        if raw.get("peft_type", "LORA") != "LORA":
            errors.append(f"peft_type {raw['peft_type']!r} is not a LoRA adapter.")
        if raw.get("use_dora"):
            errors.append("DoRA adapters (use_dora: true) are not supported.")
        if raw.get("bias", "none") != "none":
            errors.append(f"Adapter bias is not supported (bias: {raw['bias']!r}).")
        if raw.get("lora_bias"):
            errors.append("LoRA bias (lora_bias: true) is not supported.")
        other = [m for m in self.modules_to_save if m not in HEAD_MODULES]
        if other:
            errors.append(f"modules_to_save may only name the classification head "
                          f"{list(HEAD_MODULES)}; unsupported modules_to_save: {other}.")
        init = raw.get("init_lora_weights", True)
        if isinstance(init, str) and init.lower() not in _PLAIN_INITS:
            errors.append(f"init_lora_weights={init!r} changes the base weights; convert "
                          "the adapter to a plain LoRA adapter first.")
        for key, what in (("layer_replication", "layer_replication"),
                          ("alora_invocation_tokens", "Activated LoRA (aLoRA)")):
            if raw.get(key):
                errors.append(f"{what} is not supported.")
        return errors

    def rank_and_scale(self, module: str) -> tuple[int, float]:
        """(rank, scaling) PEFT uses for the module named `module` (PEFT's namespace)."""
        rank = _match(self.rank_pattern, module, self.r)
        alpha = _match(self.alpha_pattern, module, self.lora_alpha)
        return rank, alpha / (math.sqrt(rank) if self.use_rslora else rank)


def _match(patterns: dict, module: str, default: Any) -> Any:
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def load_tensors(path: str) -> dict:
    """The adapter's tensors (adapter_model.safetensors, else adapter_model.bin) on the CPU."""
    import torch
    from safetensors.torch import load_file
    folder = Path(path)
    if (folder / "adapter_model.safetensors").is_file():
        return load_file(str(folder / "adapter_model.safetensors"))
    if (folder / "adapter_model.bin").is_file():
        return torch.load(folder / "adapter_model.bin", map_location="cpu", weights_only=True)
    raise AdapterNotFoundError(f"No adapter_model.safetensors in LoRA adapter directory "
                               f"{path!r}.")


def content_digest(path: str) -> Optional[str]:
    """A short hash of the adapter's files: its identity in the prefix cache."""
    import hashlib
    h = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"):
        file = Path(path) / name
        if file.is_file():
            h.update(name.encode())
            h.update(file.read_bytes())
    return h.hexdigest()[:16]
