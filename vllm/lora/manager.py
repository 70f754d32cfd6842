"""LoRAManager: the adapters loaded into one model, and the step's row -> adapter map.

An adapter is loaded on first use (`add`): its PEFT config is checked, its factors are
laid out per projection of ours (`adapter_weights.build`) and attached to those layers
under a fresh slot. At most `max_cpu_loras` stay loaded; the least recently used one not
needed by the running step is dropped, and loaded again from its directory when a request
still names it. `begin_step` turns the scheduled requests' adapters into `StepRows`.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from vllm.config.lora import LoRAConfig
from vllm.logger import init_logger
from vllm.lora.adapter_weights import build
from vllm.lora.layers import AdapterHeads, LoRALayer
from vllm.lora.peft_config import PeftConfig, content_digest
from vllm.lora.request import LoRARequest
from vllm.lora.step import StepRows
from vllm.lora.targets import prepare

logger = init_logger(__name__)


@dataclass
class LoadedAdapter:
    request: LoRARequest
    key: str                      # identity in the prefix cache and the dedup key
    slot: int                     # index into every layer's factors
    layers: list[nn.Module] = field(default_factory=list)


class LoRAManager:
    def __init__(self, model: nn.Module, config: LoRAConfig, device: torch.device,
                 dtype: torch.dtype, per_request_head: bool) -> None:
        prepare(model.model)
        self.model, self.config, self.device, self.dtype = model, config, device, dtype
        self.step = StepRows()
        self.heads = AdapterHeads(model.head, self.step, per_request_head) \
            if model.head is not None else None
        self._loaded: OrderedDict[str, LoadedAdapter] = OrderedDict()  # by key, LRU first
        self._latest: dict[int, str] = {}  # id -> the key of its latest load
        self._known: dict[str, LoRARequest] = {}  # key -> request, to reload evicted ones
        self._slots = itertools.count(1)

    @classmethod
    def for_runner(cls, vllm_config, model: nn.Module, device) -> "LoRAManager":
        """The manager of a model runner's model. Its `heads` (the task head with a copy
        per adapter that saved one) are for the runner's pooling component to run
        (ALL/STEP pooling runs the head once per request)."""
        mc = vllm_config.model_config
        return cls(model, vllm_config.lora_config, device, mc.dtype,
                   mc.pooler_config.pooling_type in ("ALL", "STEP"))

    # ----- adapters --------------------------------------------------------------------
    def add(self, request: LoRARequest) -> str:
        """Load `request`'s adapter unless its id is loaded from the same path
        (`load_inplace`: reload anyway); returns its key. Raises ValueError for an
        adapter this engine refuses. A reload under the same id is a new key: requests
        still queued under the old weights keep them."""
        current = self._loaded.get(self._latest.get(request.lora_int_id, ""))
        if current is not None and not request.load_inplace and \
                current.request.lora_path == request.lora_path:
            self._loaded.move_to_end(current.key)
            return current.key
        adapter = self._load(request)
        same = self._loaded.pop(adapter.key, None)
        if same is not None:  # the same files again
            self._detach(same)
        self._loaded[adapter.key] = adapter
        self._latest[request.lora_int_id] = adapter.key
        self._known[adapter.key] = request
        self._trim({adapter.key})
        return adapter.key

    def remove(self, lora_int_id: int) -> bool:
        """Unload an adapter (every version of its id); False if it was not loaded."""
        self._latest.pop(lora_int_id, None)
        keys = [k for k in self._loaded if _id_of(k) == lora_int_id]
        for key in keys:
            self._detach(self._loaded.pop(key))
        return bool(keys)

    def loaded_ids(self) -> set[int]:
        return {_id_of(k) for k in self._loaded}

    def check(self, request: LoRARequest) -> None:
        """Every check `add` makes (config, tensors, shapes), without loading anything:
        safe on another thread while a step runs."""
        self._build(request)

    def _build(self, request: LoRARequest):
        cfg = PeftConfig.from_dir(request.lora_path)
        cfg.validate(self.config.max_lora_rank)
        factors, heads = build(self.model.model, cfg, request.lora_path,
                               self.config.max_lora_rank, self.dtype, self.device)
        if heads and self.heads is None:
            raise ValueError(f"The adapter {request.lora_name!r} replaces the "
                             f"{sorted(heads)} head, but this model has no classification "
                             "head (it serves embeddings); serve a classifier checkpoint.")
        return cfg, factors, heads

    def _load(self, request: LoRARequest) -> LoadedAdapter:
        cfg, factors, heads = self._build(request)
        adapter = LoadedAdapter(request, f"{request.lora_int_id}:"
                                f"{content_digest(request.lora_path)}", next(self._slots))
        for layer, pair in factors:
            if layer.lora is None:
                layer.lora = LoRALayer(self.step, layer)
            layer.lora.factors[adapter.slot] = pair
            adapter.layers.append(layer)
        for child, tensors in heads.items():
            self.heads.add(adapter.slot, child, tensors)
        logger.info("Loaded LoRA adapter %r (id %d, rank %d) from %s: %d projections%s.",
                    request.lora_name, request.lora_int_id, cfg.max_rank, request.lora_path,
                    len(factors), f", own {', '.join(heads)} head" if heads else "")
        return adapter

    def _detach(self, adapter: LoadedAdapter) -> None:
        for layer in adapter.layers:
            layer.lora.factors.pop(adapter.slot, None)
        if self.heads is not None:
            self.heads.heads.pop(adapter.slot, None)

    def _trim(self, keep: set[str]) -> None:
        """Drop least recently used adapters beyond max_cpu_loras (never those in `keep`)."""
        for key in list(self._loaded):
            if len(self._loaded) <= self.config.max_cpu_loras:
                return
            if key not in keep:
                self._detach(self._loaded.pop(key))

    def _slot_of(self, key: Optional[str]) -> int:
        if key is None:
            return 0
        adapter = self._loaded.get(key)
        if adapter is None:  # dropped by the LRU: load it again
            request = self._known[key]
            adapter = self._load(request)
            if adapter.key != key:
                self._detach(adapter)
                raise ValueError(f"LoRA adapter {request.lora_name!r} changed on disk "
                                 f"({request.lora_path}) since it was first loaded.")
            self._loaded[key] = adapter
        self._loaded.move_to_end(key)
        return adapter.slot

    # ----- one step --------------------------------------------------------------------
    def begin_step(self, scheduled: list, meta) -> None:
        """This step's rows per adapter, from the scheduled requests in their flat layout
        (`meta.query_start_loc`) and the rows the last layer keeps (`meta.output_rows`);
        the requests that finish are pooled in layout order."""
        keys = [s.request.lora_key for s in scheduled]
        slots = [self._slot_of(k) for k in keys]
        self._trim({k for k in keys if k is not None})
        rows = None if meta.output_rows is None else meta.output_rows.tolist()
        pooled = [slot for slot, s in zip(slots, scheduled) if s.finishes]
        self.step.set(slots, meta.query_start_loc, rows, pooled, self.device)

    def end_step(self) -> None:
        self.step.clear()


def _id_of(key: str) -> int:
    return int(key.split(":", 1)[0])
