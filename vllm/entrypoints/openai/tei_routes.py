"""TEI's HTTP routes on the server: one ASGI layer inside the edge (behind the API key, the
metrics and the body limits of `http_edge`) that answers TEI's paths, TEI-shaped bodies on
the paths both APIs share (/rerank, /tokenize, /invocations; `is_tei_body`), and POST / by
the model's kind. Every refusal here is TEI's `{"error", "error_type"}` with TEI's status;
successful model routes carry TEI's x-compute-* headers and feed the `te_*` metrics."""
from __future__ import annotations

import json
from typing import Any, Callable

from fastapi import Request

from vllm.entrypoints.openai.errors import APIError
from vllm.entrypoints.openai.metrics import TeiMetrics
from vllm.entrypoints.openai.serving_tei import ServingTei
from vllm.entrypoints.openai.tei_front import (ROUTES, TeiAnswer, compute_headers,
                                               count_failure, run_tei)
from vllm.entrypoints.openai.tei_protocol import TeiError, is_tei_body

SHARED = frozenset({"/rerank", "/tokenize", "/invocations"})  # TEI's only by body shape
DISPATCHED = frozenset({"/", "/invocations"})  # the route the model's kind serves
KIND_ROUTES = {"embedding": "/embed", "classifier": "/predict", "reranker": "/rerank"}
TEI_PATHS = tuple(ROUTES) + ("/", "/info", "/ping")


class TeiRoutes:
    """The ASGI layer (see the module docstring); anything else goes on to `app`."""

    def __init__(self, app: Any, serving: ServingTei, metrics: TeiMetrics,
                 info: Callable[[], dict], health: Callable[[], bool]) -> None:
        self.app = app
        self.serving = serving
        self.metrics = metrics
        self.info = info
        self.health = health

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        path, method = scope.get("path", ""), scope.get("method", "")
        if scope["type"] != "http" or scope.get("root_path"):
            await self.app(scope, receive, send)
        elif method == "GET" and path in ("/info", "/ping", "/"):
            await self._get(path, send)
        elif method == "POST" and (path in ROUTES or path in DISPATCHED):
            await self._post(scope, receive, send, path)
        else:
            await self.app(scope, receive, send)

    async def _get(self, path: str, send: Callable) -> None:
        if path == "/info":
            await _send(send, 200, self.info())
        elif self.health():
            await _send_raw(send, 200, b"", [])
        else:
            await _send(send, 503, {"error": "unhealthy", "error_type": "Unhealthy"})

    async def _post(self, scope: dict, receive: Callable, send: Callable, path: str) -> None:
        raw = await _read_body(receive)
        try:
            body = json.loads(raw)
        except ValueError as exc:
            if path in SHARED:  # not JSON: the vLLM route answers as it always has
                return await self.app(scope, _replay(raw, receive), send)
            return await self._refuse(send, TeiError("Validation", f"Failed to parse the "
                                                     f"request body as JSON: {exc}", 400))
        if path in SHARED and not is_tei_body(path, body):
            return await self.app(scope, _replay(raw, receive), send)
        if path in DISPATCHED:
            path = "/similarity" if _is_similarity(body) else self._kind_route()
        await self._answer(path, body, Request(scope, _replay(raw, receive)), send)

    def _kind_route(self) -> str:
        """The route POST / and TEI-shaped /invocations bodies take: the model kind's."""
        try:
            kind = self.serving.kind()
        except APIError:
            return "/embed"  # the engine is not ready: /embed answers TEI's 503
        if kind == "embedding" and self.serving.ctx.model_config.pooler_config.pooling_type \
                == "SPLADE":
            return "/embed_sparse"
        return KIND_ROUTES[kind]

    async def _answer(self, path: str, body: Any, http: Request, send: Callable) -> None:
        batch = isinstance(body, dict) and (isinstance(body.get("inputs"), list) or
                                            "texts" in body or path == "/similarity")
        try:
            answer = await run_tei(self.serving, self.metrics, path, body, http, batch)
        except TeiError as err:  # counted by run_tei
            return await self._send_error(send, err)
        headers = self._headers(answer) if answer.result.inputs else []
        await _send_raw(send, 200, _dumps(answer.result.body), headers)

    def _headers(self, answer: TeiAnswer) -> list[tuple[bytes, bytes]]:
        """TEI's x-compute-* headers, in milliseconds."""
        return [(k.encode(), v.encode()) for k, v in compute_headers(
            self.serving, answer).items()]

    async def _refuse(self, send: Callable, err: TeiError) -> None:
        count_failure(self.metrics, err)
        await self._send_error(send, err)

    @staticmethod
    async def _send_error(send: Callable, err: TeiError) -> None:
        extra = [(k.lower().encode(), v.encode()) for k, v in (err.headers or {}).items()]
        await _send_raw(send, err.status, _dumps(err.body()), extra)


def _is_similarity(body: Any) -> bool:
    """A sentence-similarity body (`{"inputs": {"source_sentence", "sentences"}}`, what the
    Hugging Face Inference API's sentence-similarity task and `InferenceClient.
    sentence_similarity` post to the root): it goes to /similarity, on any model kind
    (/similarity itself answers 424 where the model cannot embed)."""
    return isinstance(body, dict) and isinstance(body.get("inputs"), dict) and \
        "source_sentence" in body["inputs"]


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


async def _send(send: Callable, status: int, body: Any) -> None:
    await _send_raw(send, status, _dumps(body), [])


async def _send_raw(send: Callable, status: int, body: bytes,
                    headers: list[tuple[bytes, bytes]]) -> None:
    kind = [(b"content-type", b"application/json")] if body else []
    await send({"type": "http.response.start", "status": status,
                "headers": [*kind, (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Callable) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(raw: bytes, receive: Callable) -> Callable:
    """A receive that hands the app the body already read, then waits as ASGI does."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()
    return replay
