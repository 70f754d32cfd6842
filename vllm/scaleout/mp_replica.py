"""The front's handle on a local replica process (`--data-parallel-backend mp`)."""
from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import threading
from typing import Any, Callable, Optional

from vllm.logger import init_logger
from vllm.scaleout.replica_server import replica_main

logger = init_logger(__name__)

START_TIMEOUT_S = 600.0


class MPReplica:
    """One engine replica in a spawned child process, reached through a duplex pipe.

    `post(fn, *args)` runs `fn` on the front's event loop; results and the replica's death
    are delivered through it (`on_results(self, results)`, `on_dead(self)`).
    """

    def __init__(self, index: int, engine_args: Any, threads: Optional[int],
                 post: Callable[..., None], on_results: Callable, on_dead: Callable,
                 warmup: bool = True) -> None:
        self.index = index
        self.engine_args = engine_args
        self.threads = threads
        self.warmup = warmup  # the child warms its engine up before it reports ready
        self._post = post
        self._on_results = on_results
        self._on_dead = on_dead
        self._tokens = itertools.count()
        self._waiters: dict[int, asyncio.Future] = {}
        self._send_lock = threading.Lock()
        self.process: Optional[multiprocessing.process.BaseProcess] = None
        self.conn: Any = None

    def start(self) -> None:
        """Spawn the process and wait until its engine is loaded and warm (blocking)."""
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self.process = ctx.Process(target=replica_main, name=f"vllm-replica-{self.index}",
                                   args=(child, self.engine_args, self.index, self.threads,
                                         self.warmup),
                                   daemon=True)
        self.process.start()
        child.close()
        if not parent.poll(START_TIMEOUT_S):
            self.process.kill()
            raise RuntimeError(f"Replica {self.index} did not start in {START_TIMEOUT_S} s.")
        try:
            kind, info = parent.recv()
        except EOFError:
            kind, info = "failed", f"the process exited with code {self.process.exitcode}"
        if kind != "ready":
            self.process.join(5)
            raise RuntimeError(f"Replica {self.index} failed to start: {info}")
        self.conn = parent
        self.pid = info
        threading.Thread(target=self._read, name=f"vllm-replica-{self.index}-reader",
                         daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                self._post(self._on_dead, self)
                return
            if message[0] == "done":
                self._post(self._on_results, self, message[1])
            elif message[0] == "stats":
                self._post(self._stats_arrived, message[1], message[2])

    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self.conn.send(message)
        except (OSError, ValueError):  # died: the reader reports it
            pass

    def submit(self, items: list[tuple[str, Any, Any]]) -> None:
        self._send(("submit", items))

    def abort(self, request_ids: list[str]) -> None:
        self._send(("abort", request_ids))

    async def fetch_stats(self) -> Any:
        token = next(self._tokens)
        future = asyncio.get_running_loop().create_future()
        self._waiters[token] = future
        self._send(("stats", token))
        try:
            return await asyncio.wait_for(future, 5.0)
        finally:
            self._waiters.pop(token, None)

    def _stats_arrived(self, token: int, stats: Any) -> None:
        future = self._waiters.get(token)
        if future is not None and not future.done():
            future.set_result(stats)

    def stop(self, timeout: float = 30.0) -> None:
        self._send(("stop", None))
        if self.process is not None:
            self.process.join(timeout)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)

    def kill(self) -> None:
        """Kill the process outright (as a crash would)."""
        if self.process is not None:
            self.process.kill()
