"""Scheduler: each step, give requests tokens under a budget until each catches up.

There are no prefill/decode phases: a request's computed-token count simply grows to
its prompt length, by chunks when chunked prefill is on, whole otherwise. Partially
computed requests go first; then waiting requests in arrival order, each starting
after its cached prefix.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from vllm.config.scheduler import SchedulerConfig
from vllm.core.kv_cache_manager import BlockCopy, KVCacheManager
from vllm.core.request import Request, RequestStatus


@dataclass
class ScheduledRequest:
    request: Request
    num_computed: int     # k: tokens already in the cache before this step
    num_new: int          # n: tokens computed in this step
    block_ids: list[int]
    # A cached partial block's slots the runner copies into this request's own block
    # before the forward pass (its first step only).
    copy: Optional[BlockCopy] = None

    @property
    def finishes(self) -> bool:
        return self.num_computed + self.num_new == self.request.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new for s in self.scheduled)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager,
                 max_loras: Optional[int] = None) -> None:
        self.config = config
        self.kv = kv
        self.max_loras = max_loras  # distinct LoRA adapters in one step (None: no LoRA)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add_request(self, request: Request) -> None:
        self.kv.prepare(request)
        self.waiting.append(request)

    def abort(self, request_ids: set[str]) -> list[Request]:
        """Drop the named requests wherever they are; returns the ones found."""
        found = [r for r in list(self.waiting) + self.running if r.request_id in request_ids]
        for r in found:
            if r in self.running:
                self.running.remove(r)
            else:
                self.waiting.remove(r)
            self.kv.free(r)
            r.status = RequestStatus.ABORTED
        return found

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        """Pick this step's requests and token counts; allocates their KV blocks."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        budget, preempted = self._schedule_running(out, budget)
        if not preempted:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> tuple[int, bool]:
        preempted = False
        for req in list(self.running):
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = self._chunk(req.num_remaining, budget)
            while not self.kv.allocate_slots(req, n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            if req.status is RequestStatus.RUNNING:
                out.scheduled.append(ScheduledRequest(req, req.num_computed_tokens, n,
                                                      self.kv.block_ids(req)))
                budget -= n
        return budget, preempted

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        chunked = self.config.enable_chunked_prefill
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if not self._adapter_fits(req, out):
                break
            hits, num_hit = self.kv.get_computed_blocks(req)
            partial = self.kv.find_partial(req, num_hit)
            if partial is not None:
                num_hit += partial.num_tokens
            n = req.num_tokens - num_hit
            if n > budget and not chunked:
                break
            n = self._chunk(n, budget)
            req.num_computed_tokens = num_hit
            if not self.kv.allocate_slots(req, n, hits):
                req.num_computed_tokens = 0
                break
            copy = self.kv.copy_for(req, partial) if partial is not None else None
            self.kv.record_lookup(req.num_tokens, num_hit)
            self.waiting.popleft()
            if req.num_preemptions == 0:
                req.num_cached_tokens = num_hit
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(ScheduledRequest(req, num_hit, n, self.kv.block_ids(req),
                                                  copy))
            budget -= n

    def _adapter_fits(self, req: Request, out: SchedulerOutput) -> bool:
        """Whether `req`'s LoRA adapter keeps the step within `max_loras` adapters."""
        if self.max_loras is None or req.lora_key is None:
            return True
        keys = {s.request.lora_key for s in out.scheduled} - {None}
        return req.lora_key in keys or len(keys) < self.max_loras

    def _chunk(self, remaining: int, budget: int) -> int:
        """Tokens a request gets now: what remains, within the budget and the per-request
        cap (with chunked prefill the cap lets long prompts interleave with short ones)."""
        cap = self.config.chunk_cap
        return min(remaining, budget, cap) if cap is not None else min(remaining, budget)

    def _preempt(self, req: Request) -> None:
        """Free a running request's blocks; it restarts later (its hashed blocks may
        still be revived by its own prefix lookup)."""
        self.running.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def update(self, out: SchedulerOutput) -> list[Request]:
        """Advance computed counts after the step ran; returns requests that finished."""
        finished = []
        for s in out.scheduled:
            req = s.request
            req.num_computed_tokens = s.num_computed + s.num_new
            req.num_steps += 1
            self.kv.cache_partial(req)
            if s.finishes:
                req.status = RequestStatus.FINISHED
                self.running.remove(req)
                self.kv.free(req)
                finished.append(req)
        return finished
