"""A checkpoint's own task adapters (jina-embeddings-v3), applied per request row.

The backbone hands over its task factors (`task_factors()`: per module path, one pair per
task) and the runner builds a `TaskAdapters` from them. Each task takes a slot (its index
+ 1) in the same `LoRALayer` / `StepRows` machinery that PEFT adapters use
(vllm.lora.layers), so a step mixing tasks adds each row's own task term exactly, with no
merged weights; the embedding tables get the same per-row add (`EmbeddingLoRA`). A request
carries its task as its adapter key (`key`), which enters the dedup key and the block
hashes like a PEFT adapter's, so two tasks never share results. PEFT adapters
(`enable_lora`) are refused on such a model: the slots are the tasks'.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from vllm.lora.layers import LoRALayer
from vllm.lora.step import StepRows
from vllm.model_executor.layers.linear import Linear

KEY_PREFIX = "task:"


class EmbeddingLoRA:
    """An embedding table's per-task term: row v of task t gains A_t[v] @ (s B_t), for the
    rows of the step that run task t (`StepRows`, as a projection's `LoRALayer`)."""

    def __init__(self, step: StepRows) -> None:
        self.step = step
        self.factors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._stacked: Optional[tuple[tuple[int, ...], tuple]] = None

    def _stack(self, active: tuple[int, ...]) -> tuple:
        if self._stacked is None or self._stacked[0] != active:
            a = torch.cat([self.factors[s][0] for s in active], 1)
            b = torch.cat([self.factors[s][1] for s in active], 0)
            cols = tuple(s for s in active for _ in range(self.factors[s][0].shape[1]))
            self._stacked = (active, (a, b, cols))
        return self._stacked[1]

    def add(self, ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """`rows` (the table's rows for `ids`) with each step row's task term added."""
        plan = self.step.rows(ids.shape[0])
        active = () if plan is None else tuple(s for s in plan.slots if s in self.factors)
        if not active:
            return rows
        a, b, cols = self._stack(active)
        sel = plan.rows
        picked = ids if sel is None else ids[sel] if isinstance(sel, slice) else \
            ids.index_select(0, sel)
        h = a.index_select(0, picked)
        mask = plan.mask(cols, h.dtype)
        delta = (h if mask is None else h * mask) @ b
        if sel is None:
            return rows + delta
        if isinstance(sel, slice):
            rows[sel] += delta
        else:
            rows.index_add_(0, sel, delta)
        return rows


class TaskAdapters:
    """The task adapters attached to one backbone, and the step's row -> task map."""

    def __init__(self, backbone: nn.Module, tasks: tuple[str, ...], default: str,
                 device, dtype: torch.dtype) -> None:
        self.slots = {task: i + 1 for i, task in enumerate(tasks)}
        self.default = default
        self.device = device
        self.step = StepRows()
        for path, pairs in backbone.task_factors().items():
            if len(pairs) != len(tasks):
                raise ValueError(f"task adapters of {path!r}: {len(pairs)} for "
                                 f"{len(tasks)} tasks")
            self._attach(backbone, path, pairs, device, dtype)

    @classmethod
    def for_runner(cls, vllm_config, backbone: nn.Module, device) -> Optional["TaskAdapters"]:
        """The model's task adapters (None: it has none). They change the K/V of every
        token, so caching must be off; a bidirectional model never caches."""
        mc = vllm_config.model_config
        factors = getattr(backbone, "task_factors", None)
        if not mc.task_adapters or factors is None or not factors():
            return None
        if vllm_config.lora_config is not None:
            raise ValueError(f"enable_lora: {mc.architecture} carries its own task LoRA "
                             f"adapters ({', '.join(mc.task_adapters)}), chosen per request "
                             "by prompt_name; PEFT adapters are not supported on it.")
        assert not vllm_config.cache_config.enable_prefix_caching and \
            not vllm_config.scheduler_config.enable_chunked_prefill, \
            "task adapters run on bidirectional models only: no cache to key"
        return cls(backbone, mc.task_adapters, mc.default_task_adapter, device, mc.dtype)

    def _attach(self, backbone: nn.Module, path: str, pairs, device, dtype) -> None:
        module = backbone.get_submodule(path)
        placed = [(a.to(device=device, dtype=dtype).contiguous(),
                   b.to(device=device, dtype=dtype).contiguous()) for a, b in pairs]
        if isinstance(module, Linear):
            if module.lora is None:
                module.lora = LoRALayer(self.step, module)
            layer = module.lora
            for slot, (a, b) in enumerate(placed, 1):
                layer.factors[slot] = (a, b)
            return
        if not isinstance(module, nn.Embedding):
            raise ValueError(f"task adapter on {path!r}, which is neither a projection "
                             "nor an embedding table")
        table = EmbeddingLoRA(self.step)
        table.factors = dict(enumerate(placed, 1))
        holder, _, name = path.rpartition(".")
        owner = backbone.get_submodule(holder) if holder else backbone
        attr = {"word_embeddings": "word_lora", "token_type_embeddings": "type_lora"}.get(name)
        if attr is None or not hasattr(owner, attr):
            raise ValueError(f"task adapter on the table {path!r}, which takes none")
        setattr(owner, attr, table)

    # ----- requests ----------------------------------------------------------------------
    def key(self, task: Optional[str]) -> str:
        """The adapter key of a request for `task` (None: the default task)."""
        name = self.default if task is None else task
        if name not in self.slots:
            raise ValueError(f"Unknown task {name!r}; this model's task adapters are: "
                             f"{', '.join(map(repr, self.slots))}.")
        return KEY_PREFIX + name

    def begin_step(self, scheduled: list, meta) -> None:
        """Each scheduled request's rows run its task's slot (layout as `meta` says)."""
        slots = [self.slots[s.request.lora_key[len(KEY_PREFIX):]] for s in scheduled]
        rows = None if meta.output_rows is None else meta.output_rows.tolist()
        pooled = [slot for slot, s in zip(slots, scheduled) if s.finishes]
        self.step.set(slots, meta.query_start_loc, rows, pooled, self.device)

    def end_step(self) -> None:
        self.step.clear()
