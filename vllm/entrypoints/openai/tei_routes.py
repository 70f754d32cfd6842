"""TEI's HTTP routes on the server: one ASGI layer inside the edge (behind the API key, the
metrics and the body limits of `http_edge`) that answers TEI's paths, TEI-shaped bodies on
the paths both APIs share (/rerank, /tokenize, /invocations; `is_tei_body`), and POST / by
the model's kind. Every refusal here is TEI's `{"error", "error_type"}` with TEI's status;
successful model routes carry TEI's x-compute-* headers and feed the `te_*` metrics."""
from __future__ import annotations

import json
import re
import time
from typing import Any, Callable

from fastapi import Request
from pydantic import ValidationError

from vllm.entrypoints.openai.errors import APIError
from vllm.entrypoints.openai.metrics import TeiMetrics, engine_timer
from vllm.entrypoints.openai.serving_tei import ServingTei, TeiResult
from vllm.entrypoints.openai.tei_protocol import (DecodeRequest, EmbedAllRequest,
                                                  EmbedRequest, EmbedSparseRequest,
                                                  PredictRequest, RerankRequest,
                                                  SimilarityRequest, TeiError,
                                                  TokenizeRequest, is_tei_body)
from vllm.logger import init_logger
from vllm.version import __version__

logger = init_logger(__name__)

# path -> (request model, ServingTei method name)
ROUTES: dict[str, tuple[type, str]] = {
    "/embed": (EmbedRequest, "embed"), "/embed_all": (EmbedAllRequest, "embed_all"),
    "/embed_sparse": (EmbedSparseRequest, "embed_sparse"),
    "/predict": (PredictRequest, "predict"), "/rerank": (RerankRequest, "rerank"),
    "/similarity": (SimilarityRequest, "similarity"),
    "/tokenize": (TokenizeRequest, "tokenize"), "/decode": (DecodeRequest, "decode")}
SHARED = frozenset({"/rerank", "/tokenize", "/invocations"})  # TEI's only by body shape
DISPATCHED = frozenset({"/", "/invocations"})  # the route the model's kind serves
KIND_ROUTES = {"embedding": "/embed", "classifier": "/predict", "reranker": "/rerank"}
TEI_PATHS = tuple(ROUTES) + ("/", "/info", "/ping")
_TOO_LONG = re.compile(r"This model's maximum context length is (\d+) tokens\. However, "
                       r"you requested (\d+) tokens")


def tei_error(exc: Exception) -> TeiError:
    """Any failure of a TEI route in TEI's terms (the shared serving code raises APIError)."""
    if isinstance(exc, TeiError):
        return exc
    if isinstance(exc, ValidationError):  # a body that does not fit the route's type
        return TeiError("Validation", _pydantic_message(exc), status=422)
    if isinstance(exc, APIError):
        if exc.status == 404:
            return TeiError("Backend", exc.message)
        if exc.status == 503:
            err = TeiError("Overloaded" if exc.headers else "Unhealthy", exc.message)
            err.headers = exc.headers
            return err
        too_long = _TOO_LONG.match(exc.message)
        if exc.status == 400 and too_long:  # TEI's own wording for a too-long input
            return TeiError("Validation", "Input validation error: `inputs` must have less "
                            f"than {too_long[1]} tokens. Given: {too_long[2]}")
        if exc.status == 400:
            kind = "Tokenizer" if "out of vocabulary" in exc.message or \
                "tokenize" in exc.message else "Validation"
            return TeiError(kind, exc.message)
        if exc.status == 499:
            return TeiError("Backend", exc.message, status=499)
        return TeiError("Backend", exc.message)
    if isinstance(exc, ValueError):
        return TeiError("Validation", str(exc))
    logger.exception("TEI route failed")
    return TeiError("Backend", "Inference failed")


def _pydantic_message(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if not str(p).startswith(
        ("list[", "str", "int", "function-", "constrained"))) or "body"
    return f"Failed to deserialize the JSON body into the target type: {where}: " \
        f"{first.get('msg', 'invalid value')}"


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
            path = self._kind_route()
        await self._answer(path, body, Request(scope, _replay(raw, receive)), send)

    def _kind_route(self) -> str:
        try:
            kind = self.serving.kind()
        except APIError:
            return "/embed"  # the engine is not ready: /embed answers TEI's 503
        if kind == "embedding" and self.serving.ctx.model_config.pooler_config.pooling_type \
                == "SPLADE":
            return "/embed_sparse"
        return KIND_ROUTES[kind]

    async def _answer(self, path: str, body: Any, http: Request, send: Callable) -> None:
        model, method = ROUTES[path]
        start = time.perf_counter()
        engine_seconds = engine_timer()
        batch = isinstance(body, dict) and (isinstance(body.get("inputs"), list) or
                                            "texts" in body or path == "/similarity")
        self.metrics.count("te_request_count", "batch" if batch else "single")
        try:
            request = model.model_validate(body)
            result: TeiResult = await getattr(self.serving, method)(request, http)
        except Exception as exc:  # every failure answers TEI's body
            return await self._refuse(send, tei_error(exc))
        self.metrics.count("te_request_success", "batch" if batch else "single")
        headers: list[tuple[bytes, bytes]] = []
        if result.inputs:
            total = time.perf_counter() - start
            inference = sum(engine_seconds)
            self.metrics.observe(total, max(total - inference, 0.0), inference,
                                 result.inputs, result.tokens)
            headers = self._headers(result, total, inference)
        await _send_raw(send, 200, _dumps(result.body), headers)

    def _headers(self, result: TeiResult, total: float,
                 inference: float) -> list[tuple[bytes, bytes]]:
        """TEI's x-compute-* headers, in milliseconds; the engine does not time a request's
        queue wait apart, so x-inference-time includes it and x-queue-time is 0."""
        ms = {"x-total-time": total, "x-compute-time": total, "x-inference-time": inference,
              "x-tokenization-time": max(total - inference, 0.0), "x-queue-time": 0.0}
        device = str(getattr(self.serving.ctx.model_config, "device", "cpu"))
        values = {"x-compute-type": "cpu" if device.startswith("cpu") else "gpu",
                  "x-compute-characters": str(result.chars),
                  "x-compute-tokens": str(result.tokens),
                  **{k: str(int(v * 1000)) for k, v in ms.items()}}
        return [(k.encode(), v.encode()) for k, v in values.items()]

    async def _refuse(self, send: Callable, err: TeiError) -> None:
        label = "batch_size" if err.message.startswith("batch size") else \
            {"Empty": "validation", "Tokenizer": "tokenization", "Backend": "inference"}.get(
                err.error_type, err.error_type.lower())
        self.metrics.count("te_request_failure", label)
        extra = [(k.lower().encode(), v.encode()) for k, v in (err.headers or {}).items()]
        await _send_raw(send, err.status, _dumps(err.body()), extra)


def tei_info(serving: ServingTei, args: Any) -> dict[str, Any]:
    """TEI's /info for the served engine."""
    ctx = serving.ctx
    mc = ctx.model_config
    sched = ctx.engine.vllm_config.scheduler_config
    kind = serving.kind()
    if kind == "embedding":
        model_type: dict = {"embedding": {"pooling": str(mc.pooler_config.pooling_type)
                                          .lower()}}
    else:
        id2label = {str(k): v for k, v in sorted(mc.id2label.items())} or \
            {str(i): f"LABEL_{i}" for i in range(mc.num_labels)}
        model_type = {kind: {"id2label": id2label,
                             "label2id": {v: int(k) for k, v in id2label.items()}}}
    return {"model_id": ctx.model_name, "model_sha": None,
            "model_dtype": str(mc.dtype).replace("torch.", ""), "model_type": model_type,
            "max_concurrent_requests": ctx.limits.max_waiting_requests,
            "max_input_length": mc.max_model_len,
            "max_batch_tokens": sched.max_num_batched_tokens,
            "max_batch_requests": sched.max_num_seqs,
            "max_client_batch_size": serving.max_client_batch_size,
            "auto_truncate": True, "tokenization_workers": 1,
            "version": __version__, "sha": None, "docker_label": None}


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
