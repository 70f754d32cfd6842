"""OpenTelemetry traces of the server's requests (`--otlp-traces-endpoint URL`), as upstream
0.33: one span `llm_request` (kind SERVER) per HTTP request that ran prompts on the engine,
the child of the caller's W3C trace context (`traceparent`, `tracestate` headers), exported
over OTLP: gRPC by default, HTTP/protobuf when OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is
`http/protobuf` (upstream's variable and values). Its attributes are upstream's `gen_ai.*`
names where upstream defines one, and `vllm.*` for the tokenizer and pooler times upstream
does not report (where the time comes from: vllm/tracing.py).

The SDK and exporters are the `otel` extra, imported only when an endpoint is given; without
them the flag is refused at start-up, naming the extra.
"""
from __future__ import annotations

import os
import re
import time
from typing import Any, Callable, Optional

from vllm import envs
from vllm.logger import init_logger
from vllm.tracing import RequestTrace, tracing_request

logger = init_logger(__name__)

SPAN_NAME = "llm_request"  # upstream's
TRACE_HEADERS = (b"traceparent", b"tracestate")
DETAILED_TRACE_MODULES = ("model", "worker", "all")  # upstream's --collect-detailed-traces
PROTOCOL_VARIABLE = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
INSTALL_HINT = ('pip install -c constraints.txt -e ".[otel]" (opentelemetry-sdk and the '
                'OTLP exporters)')
# An engine request id is `<response id>-<request counter>-<prompt index>`.
_PROMPT_SUFFIX = re.compile(r"-\d+-\d+$")


def check_tracing_args(args: Any) -> Optional[str]:
    """The OTLP endpoint to export to (None: tracing off), with the flags checked: a
    ValueError names what is wrong, e.g. the missing `otel` extra."""
    endpoint = getattr(args, "otlp_traces_endpoint", None)
    detailed = getattr(args, "collect_detailed_traces", None)
    if detailed and not endpoint:
        raise ValueError("--collect-detailed-traces needs --otlp-traces-endpoint.")
    if not endpoint:
        return None
    protocol = envs.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
    if protocol not in ("grpc", "http/protobuf"):
        raise ValueError(f"{PROTOCOL_VARIABLE}={protocol!r} is not supported; use grpc "
                         "or http/protobuf.")
    try:
        import opentelemetry.sdk.trace  # noqa: F401
        if protocol == "grpc":
            import opentelemetry.exporter.otlp.proto.grpc.trace_exporter  # noqa: F401
        else:
            import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"--otlp-traces-endpoint needs the OpenTelemetry SDK and OTLP "
                         f"exporter ({exc.name} is missing): {INSTALL_HINT}.") from None
    return endpoint


class RequestTracer:
    """Turns finished `RequestTrace`s into spans sent to one OTLP endpoint (batched, on the
    SDK's own thread). `shutdown()` sends what is left."""

    def __init__(self, endpoint: str, model_name: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import \
            TraceContextTextMapPropagator
        protocol = envs.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import \
                OTLPSpanExporter
            exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import \
                OTLPSpanExporter as HTTPExporter
            exporter = HTTPExporter(endpoint=endpoint)
        # A provider of our own, not the process-global one: several servers in one
        # process (tests, several models) each export to their own endpoint.
        self.provider = TracerProvider(resource=Resource.create(
            {"vllm.process_id": str(os.getpid())}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("vllm.entrypoints.openai")
        self.propagator = TraceContextTextMapPropagator()
        self.model_name = model_name
        logger.info("OpenTelemetry traces: one %r span per request that runs prompts, "
                    "exported to %s over OTLP/%s (the forward and pooling times are in every "
                    "span: --collect-detailed-traces adds nothing).", SPAN_NAME, endpoint,
                    protocol)

    def emit(self, trace: RequestTrace, scope: dict, status: int) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode
        carrier = {k.decode(): v.decode("latin-1") for k, v in scope.get("headers", ())
                   if k in TRACE_HEADERS}
        parent = self.propagator.extract(carrier) if carrier else None
        span = self.tracer.start_span(SPAN_NAME, context=parent, kind=SpanKind.SERVER,
                                      start_time=trace.start_ns,
                                      attributes=self.attributes(trace, scope, status))
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=trace.start_ns + int((time.perf_counter() - trace.start) * 1e9))

    def attributes(self, trace: RequestTrace, scope: dict, status: int) -> dict[str, Any]:
        """The span's attributes; the engine's times are the slowest prompt's (the answer
        waits for it), the tokenizer's adds the time spent before the engine."""
        def slowest(field: str) -> float:
            return max((getattr(t, field) for t in trace.timings), default=0.0)
        return {
            "gen_ai.request.id": _PROMPT_SUFFIX.sub("", trace.request_ids[0]),
            "gen_ai.response.model": self.model_name,
            "gen_ai.usage.prompt_tokens": trace.prompt_tokens,
            "gen_ai.latency.e2e": time.perf_counter() - trace.start,
            "gen_ai.latency.time_in_queue": slowest("queue"),
            "gen_ai.latency.time_in_model_forward": slowest("forward"),
            "gen_ai.latency.time_in_model_inference": slowest("inference"),
            "vllm.latency.time_in_tokenizer": trace.tokenize_s + slowest("tokenize"),
            "vllm.latency.time_in_pooler": slowest("pool"),
            "vllm.request.num_prompts": len(trace.request_ids),
            "http.request.method": scope.get("method", ""),
            "url.path": scope.get("path", ""),
            "http.response.status_code": status,
        }

    def shutdown(self) -> None:
        self.provider.shutdown()


class TraceMiddleware:
    """Opens a `RequestTrace` for each HTTP request, current while the app handles it; a
    request that ran prompts on the engine becomes a span once its answer is sent."""

    def __init__(self, app: Any, tracer: RequestTracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_noting_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
        with tracing_request(RequestTrace()) as trace:
            try:
                await self.app(scope, receive, send_noting_status)
            finally:
                if trace.used:
                    try:
                        self.tracer.emit(trace, scope, status)
                    except Exception:  # a trace must never fail a request
                        logger.exception("Recording the request's span failed.")
