"""Run batch lines through the real server app, in-process.

Each line is one HTTP request to the same FastAPI app `vllm serve` runs (routes,
validation, error mapping, response bodies), sent through an in-memory ASGI transport
instead of a socket, so a batch answer is byte for byte what the server would answer.
Many lines are in flight at once, so the engine batches them into shared steps; answers
are written in input order.
"""
from __future__ import annotations

import asyncio
import collections
import json
import types
from typing import Any, Callable, Iterable, Optional

import httpx

from vllm.entrypoints.batch.batch_io import BatchLine, output_line, refused_line
from vllm.entrypoints.openai.api_server import build_app

# Lines in flight at once: enough to fill engine steps of max_num_seqs=128 twice over.
DEFAULT_CONCURRENCY = 256
UNBOUNDED_QUEUE = 2 ** 62


class BatchClient:
    """The server app around `engine`, answering batch lines without a socket."""

    def __init__(self, engine: Any, served_model_name: Optional[list[str]] = None,
                 model: Optional[str] = None) -> None:
        # The job bounds its own work (lines in flight), so the server's overload answer
        # (503 once many prompts wait) would only fail lines that a moment later fit.
        ns = types.SimpleNamespace(served_model_name=served_model_name, model=model,
                                   max_waiting_requests=UNBOUNDED_QUEUE)
        self.app = build_app(engine, ns)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                        base_url="http://batch.local", timeout=None)

    async def answer(self, line: BatchLine) -> dict[str, Any]:
        """The output record of one line (an error record for a refused line)."""
        if line.error is not None:
            return refused_line(line)
        response = await self.client.post(line.url, content=json.dumps(line.body),
                                          headers={"content-type": "application/json"})
        try:
            body = response.json()
        except ValueError:
            body = response.text
        return output_line(line.custom_id, response.status_code, body)

    async def answer_all(self, lines: Iterable[BatchLine],
                         emit: Callable[[dict[str, Any]], None],
                         concurrency: int = DEFAULT_CONCURRENCY) -> None:
        """Answer every line, `concurrency` at a time, calling `emit` in input order."""
        window: collections.deque[asyncio.Future] = collections.deque()
        for line in lines:
            window.append(asyncio.ensure_future(self.answer(line)))
            while window and (len(window) >= concurrency or window[0].done()):
                emit(await window.popleft())
        while window:
            emit(await window.popleft())

    async def aclose(self) -> None:
        await self.client.aclose()
