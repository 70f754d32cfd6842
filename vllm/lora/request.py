"""LoRARequest: which adapter a request runs under (upstream's name and fields)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(eq=False)
class LoRARequest:
    """A PEFT LoRA adapter directory, named for the API.

    `lora_int_id` (>= 1) identifies the adapter inside one engine: a request naming an id
    that is already loaded runs the loaded weights unless `load_inplace` asks for a reload.
    Two requests are equal when their names are equal, as upstream.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: Optional[str] = None
    load_inplace: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")
        if not self.lora_path:
            raise ValueError("lora_path cannot be empty: give the adapter's directory "
                             "(adapter_config.json + adapter_model.safetensors).")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoRARequest) and self.lora_name == other.lora_name

    def __hash__(self) -> int:
        return hash(self.lora_name)
