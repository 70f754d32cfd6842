"""StepPooling: a step's pooling as one component (the runner asks it twice per step).

Before the forward pass, `plan` says which flat rows the last layer must keep (LAST / CLS
pool one row per finishing request; the rest read every row) and which requests finish;
after it, `pool` turns the hidden states into each finishing request's output. Where the
pooling runs across chunks and cached blocks (`PoolTracker`: CLS / MEAN / ALL / STEP with
chunked prefill or prefix caching asked for), the tracker does both; otherwise the
`Pooler` runs on the step's own rows. The task head runs inside the `Pooler` either way;
with LoRA adapters it is the adapters' heads (`use_heads`: each row through its request's
adapter's copy of the head), which this component takes from the LoRA manager.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from vllm.attention.metadata import AttentionMetadata
from vllm.core.scheduler import SchedulerOutput
from vllm.model_executor.layers.pooler import Pooler, PoolingSlice
from vllm.worker.pool_steps import PoolTracker


@dataclass
class PoolPlan:
    rows: Optional[torch.Tensor]                # the last layer's kept rows (None: all)
    slices: list[PoolingSlice] = field(default_factory=list)  # finishing requests' rows
    ids: list[str] = field(default_factory=list)              # their request ids


class StepPooling:
    def __init__(self, pooler: Pooler, tracker: Optional[PoolTracker], pool_prompt: bool,
                 device: torch.device) -> None:
        self.pooler = pooler
        self.tracker = tracker
        self.pool_prompt = pool_prompt  # False: MEAN/CLS leave out a sentence-transformers prompt
        self.device = device

    def use_heads(self, heads: torch.nn.Module) -> None:
        """Run `heads` (vllm.lora.layers.AdapterHeads: the base head plus a copy per
        adapter that saved one) as the task head, in the pooler and the tracker alike."""
        self.pooler.head = heads

    def plan(self, out: SchedulerOutput, meta: AttentionMetadata) -> PoolPlan:
        """The step's pooling plan (requests laid out as in `meta`)."""
        if self.tracker is not None:
            return PoolPlan(self.tracker.rows_needed(out, meta, self.device))
        plan = PoolPlan(None)
        for i, s in enumerate(out.scheduled):
            if s.finishes:
                req = s.request
                plan.slices.append(PoolingSlice(
                    meta.query_start_loc[i], s.num_new, s.num_computed, req.prompt_token_ids,
                    req.pooling_params, 0 if self.pool_prompt else req.prompt_len or 0))
                plan.ids.append(req.request_id)
        plan.rows = self.pooler.rows_needed(plan.slices, self.device)
        return plan

    def pool(self, plan: PoolPlan, hidden: torch.Tensor, out: SchedulerOutput,
             meta: AttentionMetadata) -> dict[str, torch.Tensor]:
        """request id -> pooled output of every request that finished in this step."""
        if self.tracker is not None:
            return self.tracker.run(hidden, out, meta)
        return dict(zip(plan.ids, self.pooler(hidden, plan.slices,
                                              selected=plan.rows is not None)))
