"""Completing the server's asyncio futures from the engine thread: one pending engine request
(`Pending`) and the thread-safe ways to resolve it, a step's outputs with one wake-up per
event loop."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class Pending:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    prompt: Any
    params: Any
    lora: Any = None      # the LoRARequest it runs under (None: the base model)
    added: bool = False  # handed to the engine (False while still in the inbox)
    start: float = field(default_factory=time.perf_counter)


def complete(pending: Pending, result: Any, error: Optional[BaseException]) -> None:
    """Complete `pending`'s future; runs on its event loop."""
    if pending.future.done():
        return
    if isinstance(error, asyncio.CancelledError):
        pending.future.cancel()
    elif error is not None:
        pending.future.set_exception(error)
    else:
        pending.future.set_result(result)


def resolve(pending: Pending, *, result: Any = None,
             error: Optional[BaseException] = None) -> None:
    """Complete an asyncio future from any thread (no-op if it is done or its loop closed)."""
    try:
        pending.loop.call_soon_threadsafe(complete, pending, result, error)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


def resolve_outputs(done: list[tuple[Pending, Any]]) -> None:
    """Complete a step's finished requests with one wake-up per event loop, not one each."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Pending, Any]]] = {}
    for pending, output in done:
        by_loop.setdefault(pending.loop, []).append((pending, output))

    def complete_all(group: list[tuple[Pending, Any]]) -> None:
        for pending, output in group:
            complete(pending, output, None)
    for loop, group in by_loop.items():
        try:
            loop.call_soon_threadsafe(complete_all, group)
        except RuntimeError:
            pass
