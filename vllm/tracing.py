"""Per-request timings for OpenTelemetry traces (`vllm serve --otlp-traces-endpoint`).

The HTTP edge opens a `RequestTrace` for each request and makes it current
(`tracing_request`); the engine front (`AsyncLLM`) times the prompts submitted while a trace
is current, and only those (`EngineTimer`): tokenization, the wait for a step, the model's
forward passes and what follows them in the steps they ran in (pooling, finishing the step).
Each traced output carries its `RequestTiming`; the edge turns the trace into a span once the
answer is sent (vllm/entrypoints/openai/tracing.py, which holds the OpenTelemetry parts).

The current trace is a ContextVar, not an argument: every asyncio task a request's handler
starts copies its context, so the engine front sees the trace of the request calling it
without each route passing it along. Nothing here imports OpenTelemetry.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional, Sequence

from vllm.outputs import RequestTiming

# The trace of the HTTP request being handled (None: not traced). Context-local state.
_CURRENT: contextvars.ContextVar[Optional["RequestTrace"]] = \
    contextvars.ContextVar("vllm_request_trace", default=None)


class RequestTrace:
    """What one traced HTTP request did on the engine: its prompts, their tokens and
    timings, and the time spent tokenizing on the tokenizer thread before the engine."""

    def __init__(self) -> None:
        self.start_ns = time.time_ns()      # the span's start (wall clock)
        self.start = time.perf_counter()
        self.tokenize_s = 0.0               # tokenizer-thread time, before the engine
        self.request_ids: list[str] = []    # engine ids of its prompts, in submit order
        self.prompt_tokens = 0
        self.timings: list[RequestTiming] = []

    @property
    def used(self) -> bool:
        """Whether the request ran prompts on the engine (only those become spans)."""
        return bool(self.request_ids)

    def watch(self, request_id: str, future: asyncio.Future) -> None:
        """Count a prompt submitted to the engine, and its output once it completes."""
        self.request_ids.append(request_id)
        future.add_done_callback(self._output_done)

    def _output_done(self, future: asyncio.Future) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        output = future.result()
        self.prompt_tokens += len(getattr(output, "prompt_token_ids", None) or ())
        timing = getattr(output, "timing", None)
        if timing is not None:
            self.timings.append(timing)


def current_trace() -> Optional[RequestTrace]:
    return _CURRENT.get()


@contextlib.contextmanager
def tokenizing() -> Iterator[None]:
    """Count the time inside as the current trace's tokenizer time (if one is current)."""
    trace = _CURRENT.get()
    start = time.perf_counter()
    try:
        yield
    finally:
        if trace is not None:
            trace.tokenize_s += time.perf_counter() - start


@contextlib.contextmanager
def tracing_request(trace: RequestTrace) -> Iterator[RequestTrace]:
    """Make `trace` current for the code inside (the handling of one HTTP request)."""
    token = _CURRENT.set(trace)
    try:
        yield trace
    finally:
        _CURRENT.reset(token)


@dataclass
class _Clock:
    """One traced prompt's times inside the engine front (perf_counter seconds)."""

    start: float                         # submitted
    tokenize: float = 0.0
    added: bool = False                  # handed to the engine
    scheduled: Optional[float] = None    # start of the first step it ran in
    forward: float = 0.0
    pool: float = 0.0


class EngineTimer:
    """The engine front's timer for traced prompts. Submitting, tokenizing and stepping
    call it; with no traced prompt in flight each call is one emptiness check. The model's
    forward pass is timed by torch forward hooks, installed on the first traced step (on
    CUDA the hook fires once the kernels are queued: the wait for them then counts as
    pooling). Prompts are keyed by engine id; a prompt the engine splits (long-input
    chunks) or answers from a duplicate counts as scheduled in the first step after it
    was added."""

    def __init__(self) -> None:
        self._clocks: dict[str, _Clock] = {}
        self._hooked = False
        self._forward = 0.0       # this step's forward seconds
        self._forward_start = 0.0
        self._forward_end = 0.0

    @property
    def active(self) -> bool:
        return bool(self._clocks)

    # ----- the event loop's thread ---------------------------------------------------
    def start(self, pendings: Sequence[tuple[str, Any]]) -> Optional[RequestTrace]:
        """Clocks for (request id, Pending) pairs when a trace is current; its trace."""
        trace = _CURRENT.get()
        if trace is not None:
            for rid, pending in pendings:
                self._clocks[rid] = _Clock(pending.start)
        return trace

    def drop(self, pendings: Sequence[tuple[str, Any]]) -> None:
        for rid, _ in pendings:
            self._clocks.pop(rid, None)

    def watch(self, trace: RequestTrace, rid: str, future: asyncio.Future) -> None:
        """Forget the prompt's clock when it completes (its output is then in `trace`)."""
        future.add_done_callback(lambda f: self._clocks.pop(rid, None))
        trace.watch(rid, future)

    # ----- the engine's thread --------------------------------------------------------
    def tokenized(self, request_ids: Iterable[str], seconds: float) -> None:
        for rid in request_ids:
            clock = self._clocks.get(rid)
            if clock is not None:
                clock.tokenize += seconds

    def added(self, rid: str) -> None:
        clock = self._clocks.get(rid) if self._clocks else None
        if clock is not None:
            clock.added = True

    def step_begins(self, model: Any) -> float:
        """Before a step with traced prompts in flight: hooks on `model` (once), the
        step's forward time zeroed; returns the step's start."""
        if not self._hooked and hasattr(model, "register_forward_pre_hook"):
            model.register_forward_pre_hook(self._forward_begins)
            model.register_forward_hook(self._forward_ends)
            self._hooked = True
        self._forward = self._forward_end = 0.0
        return time.perf_counter()

    def _forward_begins(self, module: Any, args: Any) -> None:
        self._forward_start = time.perf_counter()

    def _forward_ends(self, module: Any, args: Any, output: Any) -> None:
        self._forward_end = time.perf_counter()
        self._forward += self._forward_end - self._forward_start

    def step_done(self, start: float, outputs: Sequence[Any],
                  waiting: Iterable[Any]) -> None:
        """After the step that began at `start`: the prompts it ran (every traced prompt
        added and no longer `waiting`) take its forward and pooling time, and the ones it
        finished get their `RequestTiming` on their output."""
        end = time.perf_counter()
        pool = end - self._forward_end if self._forward_end else 0.0
        finished = {o.request_id: o for o in outputs}
        still_waiting = {r.request_id for r in waiting}
        for rid, clock in list(self._clocks.items()):
            if not clock.added:
                continue
            if clock.scheduled is None:
                if rid in still_waiting and rid not in finished:
                    continue
                clock.scheduled = start
            clock.forward += self._forward
            clock.pool += pool
            output = finished.get(rid)
            if output is not None:
                output.timing = RequestTiming(
                    tokenize=clock.tokenize, forward=clock.forward, pool=clock.pool,
                    queue=max(0.0, clock.scheduled - clock.start - clock.tokenize),
                    inference=end - clock.scheduled)
