"""A checkpoint's own modeling code (config.json's `auto_map`) on the Transformers backend.

Some checkpoints ship their model classes as Python files beside the weights and name
them in config.json's `auto_map` ({"AutoModel": "modeling_x.XModel", ...}); transformers
imports them (its dynamic module loader, from the checkpoint directory, so offline too)
only when the caller trusts them (`trust_remote_code=True`). The backend runs such a
class only where neither the engine nor transformers has the architecture, and only when
the user passed `trust_remote_code=True` (`--trust-remote-code`); a native
implementation still wins under `model_impl="auto"` and then no remote code runs.

Torch-free at module level: a class is imported only when it is about to be served.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

BASE_AUTO_CLASS = "AutoModel"


@dataclass(frozen=True)
class RemoteCode:
    """The model classes a checkpoint ships (its `auto_map`) and whether they are trusted."""

    path: str
    auto_map: Mapping[str, str] = field(hash=False)  # auto class -> "module.Class"
    trusted: bool

    @classmethod
    def of(cls, hf_config: Any, path: Any, trusted: bool) -> Optional["RemoteCode"]:
        """The checkpoint's model classes (None when its auto_map names none)."""
        raw = getattr(hf_config, "auto_map", None) or {}
        models = {key: ref for key, ref in raw.items()
                  if key.startswith("AutoModel") and isinstance(ref, str)}
        return cls(str(path), models, trusted) if models else None

    def class_ref(self, arch_name: str) -> Optional[str]:
        """The auto_map reference whose class is named `arch_name` (None: not shipped)."""
        for ref in self.auto_map.values():
            if ref.rsplit(".", 1)[-1] == arch_name:
                return ref
        return None

    @property
    def base_ref(self) -> Optional[str]:
        """The base model (AutoModel): the backbone the backend runs."""
        return self.auto_map.get(BASE_AUTO_CLASS)

    def is_causal(self, hf_config: Any) -> bool:
        """A decoder: the checkpoint ships a causal LM and no masked LM (the rule
        `transformers_arch.is_causal_family` applies to transformers' own tables), and
        it is not an encoder-decoder."""
        return "AutoModelForCausalLM" in self.auto_map and \
            "AutoModelForMaskedLM" not in self.auto_map and \
            not getattr(hf_config, "is_encoder_decoder", False)

    def load_class(self, ref: str) -> type:
        """Import the class `ref` names from the checkpoint (runs the checkpoint's code)."""
        if not self.trusted:
            raise ValueError(f"{ref} is the checkpoint's own code; it runs only with "
                             "trust_remote_code=True (--trust-remote-code).")
        from transformers.dynamic_module_utils import get_class_from_dynamic_module
        return get_class_from_dynamic_module(ref, self.path)
