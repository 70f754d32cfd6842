"""The replica side of a local (mp) replica: one engine in a child process, fed through a
pipe by the front.

Messages from the front: ("submit", [(request_id, prompt, params), ...]),
("abort", [request_id, ...]), ("stats", token), ("stop", None). Answers:
("done", [Result, ...]) and ("stats", token, EngineStats). Requests run on an `AsyncLLM`,
so those arriving together share engine steps exactly as in a single-process server.
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any, Optional

from vllm.engine.async_llm import AsyncLLM
from vllm.engine.warmup import warm_up_and_reset
from vllm.logger import init_logger
from vllm.scaleout.wire import Result, pack_error, pack_future

logger = init_logger(__name__)


def replica_main(conn: Any, engine_args: Any, index: int, threads: Optional[int],
                 warmup: bool = True) -> None:
    """Child-process entry: build the engine, warm it up (unless `warmup` is False:
    `--no-warmup`), report ready, serve until stopped. SIGINT and SIGTERM are left to the
    front, which drains its requests and then stops us."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if threads:
        import torch
        torch.set_num_threads(threads)
    try:
        engine = AsyncLLM.from_engine_args(engine_args)
    except BaseException as exc:  # report it to the front rather than die silently
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    if warmup:  # before "ready": the server is healthy only once every replica is warm
        asyncio.run(warm_up_and_reset(engine, f"Replica {index}: "))
    conn.send(("ready", os.getpid()))
    logger.info("Replica %d (pid %d) is serving.", index, os.getpid())
    asyncio.run(ReplicaServer(conn, engine).serve())


class ReplicaServer:
    """Applies the front's messages to the engine and sends results back in batches."""

    def __init__(self, conn: Any, engine: AsyncLLM) -> None:
        self.conn = conn
        self.engine = engine
        self.outbox: list[Result] = []
        self.flush_scheduled = False

    async def serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stopped = asyncio.Event()
        threading.Thread(target=self._read, name="vllm-replica-reader", daemon=True).start()
        await self.stopped.wait()
        self.engine.shutdown()

    def _read(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):  # the front is gone: stop
                message = ("stop", None)
            self.loop.call_soon_threadsafe(self._handle, message)
            if message[0] == "stop":
                return

    def _handle(self, message: tuple) -> None:
        kind, payload = message[0], message[1]
        if kind == "submit":
            for request_id, prompt, params in payload:
                self._submit(request_id, prompt, params)
        elif kind == "abort":
            self.engine.abort(payload)
        elif kind == "stats":
            self._send(("stats", payload, self.engine.stats))
        elif kind == "stop":
            self.stopped.set()

    def _submit(self, request_id: str, prompt: Any, params: Any) -> None:
        try:
            future = self.engine.submit(prompt, params, request_id)
        except Exception as exc:
            self._emit(pack_error(request_id, exc))
            return
        future.add_done_callback(lambda f: self._emit(pack_future(request_id, f)))

    def _emit(self, result: Optional[Result]) -> None:
        if result is None:
            return
        self.outbox.append(result)
        if not self.flush_scheduled:  # one message per event-loop pass, not per request
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        out, self.outbox = self.outbox, []
        self._send(("done", out))

    def _send(self, message: tuple) -> None:
        try:
            self.conn.send(message)
        except (OSError, ValueError):
            self.stopped.set()
