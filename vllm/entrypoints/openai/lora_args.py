"""`vllm serve`'s LoRA flags, with upstream's names and `--lora-modules` forms."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Optional

# EngineArgs fields these flags set.
LORA_ENGINE_FIELDS = ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras")


@dataclass
class LoRAModulePath:
    """One `--lora-modules` entry: the name clients use, the adapter directory, and the
    base model its /v1/models card names as parent (default: the served model)."""

    name: str
    path: str
    base_model_name: Optional[str] = None


class LoRAModulesAction(argparse.Action):
    """`name=path` or a JSON object {"name", "path", "base_model_name"} per value."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        modules = []
        for item in values or []:
            if not item:
                continue
            if "=" in item and "," not in item and not item.lstrip().startswith("{"):
                name, path = item.split("=", 1)
                modules.append(LoRAModulePath(name, path))
                continue
            try:
                modules.append(LoRAModulePath(**json.loads(item)))
            except json.JSONDecodeError:
                parser.error(f"Invalid JSON format for --lora-modules: {item}")
            except TypeError as exc:
                parser.error(f"Invalid fields for --lora-modules: {item} - {exc}")
        setattr(namespace, self.dest, modules)


def add_lora_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("LoRA adapters")
    group.add_argument("--enable-lora", action="store_true",
                       help="Serve LoRA adapters on the base model (a request's `model` "
                       "names the adapter).")
    group.add_argument("--max-loras", type=int, default=1,
                       help="Most distinct adapters in one engine step (default 1).")
    group.add_argument("--max-lora-rank", type=int, default=16,
                       help="Largest adapter rank accepted (default 16).")
    group.add_argument("--max-cpu-loras", type=int, default=None,
                       help="Adapters kept loaded; the least recently used one beyond this "
                       "is reloaded from disk when next needed (default: --max-loras).")
    group.add_argument("--lora-modules", nargs="+", action=LoRAModulesAction, default=[],
                       metavar="NAME=PATH",
                       help="Adapters to serve: name=path, or JSON "
                       '\'{"name": ..., "path": ..., "base_model_name": ...}\'.')
