"""TEI's gRPC service over `ServingTei`: unary RPCs run `tei_front.run_tei` on the mapped
body (tei_mapping.py); streams answer each message as its unary RPC does, concurrently, in
the order the messages came; RerankStream ranks every (query, text) it was sent. Failures
are TEI's error types answered with the gRPC status TEI gives each."""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable, Optional

import grpc

from vllm.entrypoints.grpc.tei_mapping import (DIRECTIONS, STREAMS, UNARY, Rpc,
                                               info_response, metadata, ranks)
from vllm.entrypoints.openai.metrics import TeiMetrics
from vllm.entrypoints.openai.serving_tei import ServingTei, TeiResult
from vllm.entrypoints.openai.tei_front import (TeiAnswer, TeiTimes, compute_headers,
                                               run_tei, tei_error)
from vllm.entrypoints.openai.tei_protocol import TeiError

# TEI's error type -> gRPC status (TEI's router maps them so).
STATUS = {"Unhealthy": grpc.StatusCode.UNAVAILABLE,
          "Backend": grpc.StatusCode.FAILED_PRECONDITION,
          "Overloaded": grpc.StatusCode.RESOURCE_EXHAUSTED,
          "Validation": grpc.StatusCode.INVALID_ARGUMENT,
          "Tokenizer": grpc.StatusCode.FAILED_PRECONDITION,
          "Empty": grpc.StatusCode.INVALID_ARGUMENT}
# Messages of one stream answered at once, at most (later ones wait to be read).
MAX_PARALLEL_STREAM_REQUESTS = 1024


class GrpcCall:
    """What the serving code reads of an HTTP request, for a gRPC call: its metadata as
    headers (x-request-id), and `receive()`, which reports a disconnect once the call is
    over (cancelled by the client), so that its engine requests are aborted."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self.headers = {k: v for k, v in (context.invocation_metadata() or ())
                        if isinstance(v, str)}
        self._context = context

    async def receive(self) -> dict:
        loop = asyncio.get_running_loop()
        over = loop.create_future()
        self._context.add_done_callback(
            lambda _: loop.call_soon_threadsafe(lambda: over.done() or over.set_result(None)))
        await over
        return {"type": "http.disconnect"}


def status_of(err: TeiError) -> grpc.StatusCode:
    return grpc.StatusCode.CANCELLED if err.status == 499 else \
        STATUS.get(err.error_type, grpc.StatusCode.INTERNAL)


class TeiService:
    """The behaviours of tei.v1's methods, by "Service/Method" (see `behaviours`)."""

    def __init__(self, serving: ServingTei, metrics: TeiMetrics, pb: Any,
                 info: Callable[[], dict]) -> None:
        self.serving = serving
        self.metrics = metrics
        self.pb = pb
        self.info = info

    def behaviours(self) -> dict[str, Callable]:
        found: dict[str, Callable] = {"Info/Info": self.info_rpc,
                                      "Rerank/RerankStream": self.rerank_stream}
        for name, rpc in UNARY.items():
            found[name] = self._unary(rpc)
        for name, unary in STREAMS.items():
            found[name] = self._stream(UNARY[unary])
        return found

    async def _answer(self, rpc: Rpc, message: Any, context: Any) -> TeiAnswer:
        return await run_tei(self.serving, self.metrics, rpc.path, rpc.body(message),
                             GrpcCall(context), rpc.batch)

    def _unary(self, rpc: Rpc) -> Callable:
        async def behaviour(message: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                answer = await self._answer(rpc, message, context)
            except TeiError as err:
                await context.abort(status_of(err), err.message)
            if answer.result.inputs:  # TEI's x-compute-* headers, as initial metadata
                await context.send_initial_metadata(
                    tuple(compute_headers(self.serving, answer).items()))
            return rpc.response(self.pb, answer)
        return behaviour

    def _stream(self, rpc: Rpc) -> Callable:
        async def behaviour(messages: AsyncIterator[Any],
                            context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for answer in _in_order(messages, lambda m: self._answer(rpc, m, context)):
                if isinstance(answer, TeiError):
                    await context.abort(status_of(answer), answer.message)
                yield rpc.response(self.pb, answer)
        return behaviour

    async def info_rpc(self, message: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return info_response(self.pb, self.info())
        except Exception as exc:  # e.g. the engine is not ready: TEI's Unhealthy
            err = tei_error(exc)
            await context.abort(status_of(err), err.message)

    async def rerank_stream(self, messages: AsyncIterator[Any],
                            context: grpc.aio.ServicerContext) -> Any:
        """Rank every (query, text) sent: runs of one query and truncation are reranked as
        /rerank bodies of at most --max-client-batch-size texts, all at once."""
        start = time.perf_counter()
        items = [m async for m in messages]
        first = items[0] if items else self.pb.RerankStreamRequest()
        groups: dict[tuple, list[int]] = {}
        for i, m in enumerate(items):
            groups.setdefault((m.query, m.truncate, m.truncation_direction), []).append(i)
        size = self.serving.max_client_batch_size
        chunks = [(key, ids[j:j + size]) for key, ids in groups.items()
                  for j in range(0, len(ids), size)] or [(("", False, 0), [])]
        try:
            answers = await asyncio.gather(*(run_tei(
                self.serving, self.metrics, "/rerank", {
                    "query": key[0], "texts": [items[i].text for i in ids],
                    "truncate": key[1], "truncation_direction": DIRECTIONS.get(key[2], "Right"),
                    "raw_scores": first.raw_scores}, GrpcCall(context), True)
                for key, ids in chunks))
        except TeiError as err:
            await context.abort(status_of(err), err.message)
        ranked = sorted(({"index": ids[r["index"]], "score": r["score"]} |
                         ({"text": items[ids[r["index"]]].text} if first.return_text else {})
                         for (_, ids), a in zip(chunks, answers) for r in a.result.body),
                        key=lambda r: r["score"], reverse=True)
        total = TeiAnswer(TeiResult(None, sum(a.result.chars for a in answers),
                                    sum(a.result.tokens for a in answers), len(items)),
                          _merged_times(start, [a.times for a in answers]))
        return self.pb.RerankResponse(ranks=ranks(self.pb, ranked),
                                      metadata=metadata(self.pb, total))


def _merged_times(start: float, times: list[TeiTimes]) -> TeiTimes:
    """The chunks ran together: the wall time, and the longest chunk's parts."""
    inference = max((t.inference for t in times), default=0.0)
    total = time.perf_counter() - start
    return TeiTimes(total, max(total - inference, 0.0), 0.0, inference)


async def _in_order(messages: AsyncIterator[Any],
                    answer: Callable[[Any], Any]) -> AsyncIterator[Any]:
    """Each message's answer (or its TeiError), in message order, while later messages
    are read and answered concurrently (at most MAX_PARALLEL_STREAM_REQUESTS at once)."""
    pending: asyncio.Queue[Optional[asyncio.Task]] = asyncio.Queue()
    room = asyncio.Semaphore(MAX_PARALLEL_STREAM_REQUESTS)

    async def read() -> None:
        try:
            async for message in messages:
                await room.acquire()
                task = asyncio.ensure_future(answer(message))
                task.add_done_callback(lambda _: room.release())
                pending.put_nowait(task)
        finally:
            pending.put_nowait(None)

    reader = asyncio.ensure_future(read())
    try:
        while (task := await pending.get()) is not None:
            try:
                yield await task
            except TeiError as err:
                yield err
                return
        await reader  # a failure reading the requests ends the call with it
    finally:
        reader.cancel()
        while not pending.empty():
            left = pending.get_nowait()
            if left is not None:
                left.cancel()
