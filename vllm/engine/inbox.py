"""The hand-over between AsyncLLM's callers and its engine loop.

Every prompt submitted and not yet answered is a `Pending` here, by request id. Those the
engine has not taken yet wait in arrival order (queued); aborts of prompts already inside the
engine wait for the loop to apply them. One condition variable guards all of it: callers
put, queue and abort from any thread; the engine loop takes, waits, and pops what finished.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from vllm.engine.futures import Pending, resolve


@dataclass(frozen=True)
class ArrivalWindow:
    """How long a drained engine waits for the next step's requests (seconds)."""
    gap: float = 0.003  # start once no request has arrived for this long
    cap: float = 0.030  # and never wait longer than this after the step


# What `Inbox.next_work` returns when its timeout passed with nothing to do.
IDLE: tuple = ((), ())  # immutable: only ever compared by identity


class Inbox:
    """Prompts submitted to AsyncLLM and not yet answered (see the module docstring)."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.pending: dict[str, Pending] = {}
        self._queued: OrderedDict[str, None] = OrderedDict()  # ids not yet in the engine
        self._aborts: list[str] = []
        self.stopping = False

    @property
    def num_queued(self) -> int:
        return len(self._queued)

    # ----- callers ----------------------------------------------------------------------
    def put(self, items: Sequence[tuple[str, Pending, bool]], check: Callable[[], None]) -> None:
        """Register every (id, pending, queue now) together, one wake-up; a prompt not
        queued now is queued later by `queue` (once tokenized). `check()` runs under the
        lock first and may raise to refuse them all; a duplicate id refuses them all with
        ValueError."""
        with self.cv:
            check()
            ids = [rid for rid, _, _ in items]
            taken = [rid for rid in ids if rid in self.pending]
            if taken or len(set(ids)) < len(ids):
                raise ValueError(f"Request id {(taken or ids)[0]!r} is already running.")
            for rid, pending, now in items:
                self.pending[rid] = pending
                if now:
                    self._queued[rid] = None
            self.cv.notify()

    def queue(self, request_id: str, pending: Pending) -> None:
        """Queue a prompt `put` held back, unless it was aborted meanwhile."""
        with self.cv:
            if self.pending.get(request_id) is pending:
                self._queued[request_id] = None
                self.cv.notify()

    def abort(self, request_ids: Sequence[str]) -> None:
        """Forget these requests and cancel their futures; those inside the engine are
        aborted there by the loop."""
        with self.cv:
            for rid in request_ids:
                pending = self.pending.pop(rid, None)
                if pending is None:
                    continue
                if pending.added:
                    self._aborts.append(rid)
                else:  # still queued (or being tokenized)
                    self._queued.pop(rid, None)
                resolve(pending, error=asyncio.CancelledError())
            self.cv.notify()

    def stop(self) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify()

    # ----- the engine loop --------------------------------------------------------------
    def next_work(self, busy: bool, room: Optional[int] = None,
                  timeout: Optional[float] = None
                  ) -> Optional[tuple[list[str], list[tuple[str, Pending]]]]:
        """Wait for work unless `busy` (at most `timeout` seconds, then IDLE); None
        once stopping. Else (aborts to apply, the queued requests the engine takes now,
        oldest first, marked added): all of them, or at most `room`."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        with self.cv:
            while not (self.stopping or self._queued or self._aborts or busy):
                if deadline is None:
                    self.cv.wait()
                elif not self.cv.wait(max(0.0, deadline - time.perf_counter())):
                    return IDLE  # idle for `timeout`: the caller's housekeeping
            if self.stopping:
                return None
            aborts, self._aborts = self._aborts, []
            count = len(self._queued) if room is None else min(len(self._queued), max(0, room))
            new = [(rid, self.pending[rid]) for rid in
                   (self._queued.popitem(last=False)[0] for _ in range(count))]
            for _, pending in new:
                pending.added = True
            return aborts, new

    def await_arrivals(self, expected: int, window: ArrivalWindow) -> None:
        """The engine is empty after a step that finished `expected` requests: wait until
        as many have arrived, or none for `gap` since the last, or `cap` in all (an abort
        or a stop ends the wait)."""
        deadline = time.perf_counter() + window.cap
        with self.cv:
            while len(self._queued) < expected and not (self.stopping or self._aborts):
                left = deadline - time.perf_counter()
                if left <= 0:
                    return
                arrived = len(self._queued)
                self.cv.wait(min(left, window.gap) if arrived else left)
                if arrived and len(self._queued) == arrived:
                    return

    def pause(self, seconds: float) -> None:
        """Wait `seconds` unless a caller wakes the loop (nothing could be scheduled)."""
        with self.cv:
            self.cv.wait(seconds)

    def forget(self, request_id: str) -> None:
        with self.cv:
            self.pending.pop(request_id, None)

    def finished(self, outputs: Sequence[Any]) -> list[tuple[Pending, Any]]:
        """Pop the pending entry of each output (those aborted meanwhile are gone)."""
        with self.cv:
            done = [(self.pending.pop(o.request_id, None), o) for o in outputs]
        return [(p, o) for p, o in done if p is not None]

    def take_added(self) -> list[tuple[str, Pending]]:
        """Pop every request inside the engine (a step failed)."""
        with self.cv:
            added = [rid for rid, p in self.pending.items() if p.added]
            return [(rid, self.pending.pop(rid)) for rid in added]

    def drain(self) -> list[Pending]:
        """Pop everything (the loop stopped)."""
        with self.cv:
            pending, self.pending = list(self.pending.values()), {}
            self._queued, self._aborts = OrderedDict(), []
        return pending
