"""One TEI call, whatever the transport: the HTTP routes (tei_routes.py) and the gRPC
service (vllm/entrypoints/grpc) both hand a TEI-shaped JSON body to `run_tei`, which
validates it into the route's request type, runs `ServingTei`'s method, counts and times
it in the te_* metrics, and turns any failure into TEI's error type (`tei_error`). Each
transport only maps its wire format onto these bodies and answers, and `TeiError`s onto
its own statuses."""
from __future__ import annotations

import re
import time
from typing import Any, NamedTuple

from fastapi import Request
from pydantic import ValidationError

from vllm.entrypoints.openai.errors import APIError
from vllm.entrypoints.openai.metrics import TeiMetrics, engine_timer
from vllm.entrypoints.openai.serving_tei import ServingTei, TeiResult
from vllm.entrypoints.openai.tei_protocol import (DecodeRequest, EmbedAllRequest,
                                                  EmbedRequest, EmbedSparseRequest,
                                                  PredictRequest, RerankRequest,
                                                  SimilarityRequest, TeiError,
                                                  TokenizeRequest)
from vllm.logger import init_logger
from vllm.version import __version__

logger = init_logger(__name__)

# TEI path -> (request model, ServingTei method name)
ROUTES: dict[str, tuple[type, str]] = {
    "/embed": (EmbedRequest, "embed"), "/embed_all": (EmbedAllRequest, "embed_all"),
    "/embed_sparse": (EmbedSparseRequest, "embed_sparse"),
    "/predict": (PredictRequest, "predict"), "/rerank": (RerankRequest, "rerank"),
    "/similarity": (SimilarityRequest, "similarity"),
    "/tokenize": (TokenizeRequest, "tokenize"), "/decode": (DecodeRequest, "decode")}
_TOO_LONG = re.compile(r"This model's maximum context length is (\d+) tokens\. However, "
                       r"you requested (\d+) tokens")


class TeiTimes(NamedTuple):
    """A call's seconds as TEI reports them. The engine does not time a request's queue
    wait apart, so `inference` includes it and `queue` is 0."""
    total: float
    tokenization: float
    queue: float
    inference: float


class TeiAnswer(NamedTuple):
    result: TeiResult
    times: TeiTimes


def tei_error(exc: Exception) -> TeiError:
    """Any failure of a TEI call in TEI's terms (the shared serving code raises APIError)."""
    if isinstance(exc, TeiError):
        return exc
    if isinstance(exc, ValidationError):  # a body that does not fit the route's type
        return TeiError("Validation", _pydantic_message(exc), status=422)
    if isinstance(exc, APIError):
        return _api_error(exc)
    if isinstance(exc, ValueError):
        return TeiError("Validation", str(exc))
    logger.exception("TEI call failed")
    return TeiError("Backend", "Inference failed")


def _api_error(exc: APIError) -> TeiError:
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


def _pydantic_message(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if not str(p).startswith(
        ("list[", "str", "int", "function-", "constrained"))) or "body"
    return f"Failed to deserialize the JSON body into the target type: {where}: " \
        f"{first.get('msg', 'invalid value')}"


def count_failure(metrics: TeiMetrics, err: TeiError) -> None:
    """te_request_failure, labelled as TEI labels its failures."""
    label = "batch_size" if err.message.startswith("batch size") else \
        {"Empty": "validation", "Tokenizer": "tokenization", "Backend": "inference"}.get(
            err.error_type, err.error_type.lower())
    metrics.count("te_request_failure", label)


async def run_tei(serving: ServingTei, metrics: TeiMetrics, path: str, body: Any,
                  http: Request, batch: bool) -> TeiAnswer:
    """Answer the TEI JSON `body` of `path` (a key of ROUTES); raises TeiError, already
    counted. `batch`: TEI's te_request_count label (a list of inputs, or not)."""
    model, method = ROUTES[path]
    start = time.perf_counter()
    engine_seconds = engine_timer()
    method_label = "batch" if batch else "single"
    metrics.count("te_request_count", method_label)
    try:
        request = model.model_validate(body)
        result: TeiResult = await getattr(serving, method)(request, http)
    except Exception as exc:  # every failure is TEI's
        err = tei_error(exc)
        count_failure(metrics, err)
        raise err from None
    metrics.count("te_request_success", method_label)
    total = time.perf_counter() - start
    inference = sum(engine_seconds)
    times = TeiTimes(total, max(total - inference, 0.0), 0.0, inference)
    if result.inputs:
        metrics.observe(total, times.tokenization, inference, result.inputs, result.tokens)
    return TeiAnswer(result, times)


def compute_headers(serving: ServingTei, answer: TeiAnswer) -> dict[str, str]:
    """TEI's x-compute-* values (times in whole milliseconds); the HTTP headers, and gRPC's
    initial metadata."""
    result, times = answer
    device = str(getattr(serving.ctx.model_config, "device", "cpu"))
    ms = {"x-total-time": times.total, "x-compute-time": times.total,
          "x-inference-time": times.inference, "x-tokenization-time": times.tokenization,
          "x-queue-time": times.queue}
    return {"x-compute-type": "cpu" if device.startswith("cpu") else "gpu",
            "x-compute-characters": str(result.chars), "x-compute-tokens": str(result.tokens),
            **{k: str(int(v * 1000)) for k, v in ms.items()}}


def tei_info(serving: ServingTei, args: Any) -> dict[str, Any]:
    """TEI's /info (and gRPC Info) for the served engine."""
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
