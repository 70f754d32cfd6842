"""Prometheus metrics (`vllm:` prefix), one CollectorRegistry per app.

HTTP-level counters and latencies are recorded by an ASGI middleware; the engine's own
counters (steps, tokens, running/waiting, prefix-cache queries and hits) are read from
`AsyncLLM.stats` at scrape time, so they can never drift from the engine.
"""
from __future__ import annotations

import contextvars
import time
from collections import Counter as Tally
from typing import Any, Callable, Iterable, Mapping, Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# The engine seconds of the HTTP request being handled (a list each `ServingContext.run`
# appends to), when a front end asked for them (`engine_timer`): TEI's x-inference-time.
_ENGINE_SECONDS: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar(
    "engine_seconds", default=None)


def engine_timer() -> list:
    """Start collecting this request's engine seconds; returns the list they land in."""
    seconds: list = []
    _ENGINE_SECONDS.set(seconds)
    return seconds

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0)

# (metric name, engine stats field, help) — counters, exported with a `_total` suffix.
_ENGINE_COUNTERS = (
    ("vllm:request_success", "num_requests_finished", "Engine requests finished."),
    ("vllm:prompt_tokens", "prompt_tokens", "Prompt tokens processed by the engine."),
    ("vllm:computed_tokens", "computed_tokens",
     "Prompt tokens actually run through the model (prompt tokens minus cache hits)."),
    ("vllm:engine_steps", "num_steps", "Engine steps run (one batched forward each)."),
    ("vllm:prefix_cache_queries", "prefix_cache_queries",
     "Prompt tokens looked up in the prefix cache."),
    ("vllm:prefix_cache_hits", "prefix_cache_hits",
     "Prompt tokens found in the prefix cache (not recomputed)."),
    ("vllm:num_preemptions", "num_preemptions", "Requests preempted by the scheduler."),
    ("vllm:chunked_prefill_splits", "num_split_requests",
     "Requests whose prompt was split over several steps."),
    ("vllm:kv_cache_evictions", "num_evictions", "Cached KV blocks evicted for reuse."),
)
_ENGINE_GAUGES = (
    ("vllm:num_requests_running", "num_running", "Requests in the running batch."),
    ("vllm:num_requests_waiting", "num_waiting", "Requests waiting to be scheduled."),
)


class _EngineStatsCollector:
    """Exports the engine's counters as they are at scrape time."""

    def __init__(self, get_stats: Callable[[], Optional[Any]], model_name: str) -> None:
        self._get_stats = get_stats
        self._model_name = model_name

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        stats = self._get_stats()
        # Data parallel: one stats object per replica, exported with a `replica` label.
        per_replica = stats if isinstance(stats, Mapping) else None
        labels = ["model_name", "replica"] if per_replica is not None else ["model_name"]
        rows = [([self._model_name, r], s) for r, s in per_replica.items()] \
            if per_replica is not None else [([self._model_name], stats)]
        for family, specs in ((CounterMetricFamily, _ENGINE_COUNTERS),
                              (GaugeMetricFamily, _ENGINE_GAUGES)):
            for name, field, doc in specs:
                metric = family(name, doc, labels=labels)
                for label, s in rows:
                    metric.add_metric(label, float(getattr(s, field, 0) or 0))
                yield metric


class ServerMetrics:
    """All metrics of one app, in the app's own registry."""

    def __init__(self, get_stats: Callable[[], Optional[Any]], model_name: str,
                 known_routes: Iterable[str]) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.known_routes = frozenset(known_routes)
        self.http_requests = Counter(
            "vllm:http_requests", "HTTP requests answered, by route, method and status.",
            ["route", "method", "status"], registry=self.registry)
        self.http_latency = Histogram(
            "vllm:http_request_duration_seconds", "Time to answer an HTTP request.",
            ["route"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.e2e_latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Time from handing an HTTP request's prompts to the engine until all finished.",
            ["model_name"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_EngineStatsCollector(get_stats, model_name))
        self.tei = TeiMetrics(self.registry)

    def observe_engine_latency(self, seconds: float) -> None:
        self.e2e_latency.labels(self.model_name).observe(seconds)
        timed = _ENGINE_SECONDS.get()
        if timed is not None:
            timed.append(seconds)

    def observe_http(self, path: str, method: str, status: int, seconds: float) -> None:
        route = path if path in self.known_routes else "other"
        self.http_requests.labels(route, method, str(status)).inc()
        self.http_latency.labels(route).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _TeiCounters:
    """TEI's counters, exported under TEI's own names (no `_total` suffix, as TEI's
    exporter writes them): te_request_count / te_request_success by `method` (single or
    batch), te_request_failure by `err`."""

    NAMES = {"te_request_count": "method", "te_request_success": "method",
             "te_request_failure": "err"}

    def __init__(self) -> None:
        self.counts: dict[str, Tally] = {name: Tally() for name in self.NAMES}

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        for name, label in self.NAMES.items():
            metric = Metric(name, f"TEI API: {name.split('_', 2)[2]} requests.", "counter")
            for value, count in sorted(self.counts[name].items()):
                metric.add_sample(name, {label: value}, float(count))
            yield metric


class TeiMetrics:
    """The `te_*` metrics of the TEI routes (beside the `vllm:` ones, same registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counters = _TeiCounters()
        registry.register(self.counters)
        self.histograms = {name: Histogram(name, doc, buckets=_LATENCY_BUCKETS,
                                           registry=registry) for name, doc in (
            ("te_request_duration", "TEI API: time to answer a request (s)."),
            ("te_request_tokenization_duration", "TEI API: time outside the engine (s)."),
            ("te_request_queue_duration", "TEI API: queue time timed apart (s; 0 here: "
             "the engine's time includes its queue)."),
            ("te_request_inference_duration", "TEI API: time in the engine (s)."))}
        self.batch_size = Histogram(
            "te_batch_next_size", "TEI API: inputs a request handed to the engine at once.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=registry)
        self.input_length = Histogram(
            "te_request_input_length", "TEI API: tokens of a request's inputs.",
            buckets=(8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
            registry=registry)

    def count(self, name: str, value: str) -> None:
        self.counters.counts[name][value] += 1

    def observe(self, total: float, tokenization: float, inference: float, inputs: int,
                tokens: int) -> None:
        for name, seconds in (("te_request_duration", total),
                              ("te_request_tokenization_duration", tokenization),
                              ("te_request_queue_duration", 0.0),
                              ("te_request_inference_duration", inference)):
            self.histograms[name].observe(seconds)
        if inputs:
            self.batch_size.observe(inputs)
            self.input_length.observe(tokens)


class MetricsMiddleware:
    """Counts and times every HTTP request; echoes `X-Request-Id` on the response."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        request_id = next((v for k, v in scope.get("headers", ()) if k == b"x-request-id"), None)

        async def send_wrapper(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if request_id is not None:
                    message = dict(message)
                    message["headers"] = list(message.get("headers", ())) + [
                        (b"x-request-id", request_id)]
            await send(message)
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.observe_http(scope.get("path", ""), scope.get("method", ""), status,
                                      time.perf_counter() - start)
