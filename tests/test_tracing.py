"""OpenTelemetry traces (issue 38 item 4): `--otlp-traces-endpoint` sends one `llm_request`
span per request that runs prompts, the child of the caller's `traceparent`, with the
tokenize, queue, forward and pool times, to an in-process OTLP collector (HTTP/protobuf
and gRPC, the two protocols upstream's variable selects)."""
from __future__ import annotations

import http.server
import threading
import time
from concurrent import futures

import pytest

pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
from opentelemetry.proto.collector.trace.v1 import (trace_service_pb2,  # noqa: E402
                                                    trace_service_pb2_grpc)

from servers import MINILM, Server  # noqa: E402
from vllm.entrypoints.openai.cli_args import parse_serve_args  # noqa: E402
from vllm.entrypoints.openai.tracing import check_tracing_args  # noqa: E402

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TIMINGS = ("gen_ai.latency.e2e", "gen_ai.latency.time_in_queue",
           "gen_ai.latency.time_in_model_forward", "gen_ai.latency.time_in_model_inference",
           "vllm.latency.time_in_tokenizer", "vllm.latency.time_in_pooler")


class Collector:
    """Spans received by an OTLP collector, decoded from ExportTraceServiceRequests."""

    def __init__(self) -> None:
        self.spans: list = []
        self.lock = threading.Lock()

    def receive(self, payload: bytes) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(payload)
        with self.lock:
            self.spans += [s for rs in request.resource_spans for ss in rs.scope_spans
                           for s in ss.spans]

    def wait_for(self, count: int, timeout: float = 20.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.spans) >= count:
                    return list(self.spans)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.spans)} span(s) received, expected {count}")


@pytest.fixture
def http_collector():
    collector = Collector()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status = 404
            if self.path == "/v1/traces":
                collector.receive(body)
                status = 200
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args) -> None:
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    collector.url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    yield collector
    server.shutdown()
    server.server_close()


def _attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def _traced_server(engine, endpoint: str, monkeypatch, protocol: str) -> Server:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # ms: export promptly
    return Server(engine, served_model_name=[MINILM], otlp_traces_endpoint=endpoint)


def test_a_span_per_request_joins_the_callers_trace(minilm_engine, http_collector,
                                                   monkeypatch):
    server = _traced_server(minilm_engine, http_collector.url, monkeypatch, "http/protobuf")
    try:
        header = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        texts = ["A man is eating food.", "A plane is taking off."]
        r = server.post("/v1/embeddings", {"input": texts}, headers=header)
        assert r.status_code == 200
        assert server.client.get("/health").status_code == 200  # runs no prompt: no span
        pairs = server.post("/score", {"text_1": "a query", "text_2": ["doc one", "doc two"]})
        assert pairs.status_code == 200
        spans = http_collector.wait_for(2)
        time.sleep(0.3)
        assert len(http_collector.spans) == 2  # /health made none
    finally:
        server.close()
        server.app.state.tracer.shutdown()
    by_path = {_attrs(s)["url.path"]: s for s in spans}
    span = by_path["/v1/embeddings"]
    assert span.name == "llm_request" and span.kind == span.SPAN_KIND_SERVER
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
    attrs = _attrs(span)
    assert attrs["gen_ai.request.id"] == r.json()["id"]
    assert attrs["gen_ai.response.model"] == MINILM
    assert attrs["gen_ai.usage.prompt_tokens"] == r.json()["usage"]["prompt_tokens"]
    assert attrs["vllm.request.num_prompts"] == 2
    assert attrs["http.response.status_code"] == 200 and attrs["http.request.method"] == "POST"
    assert all(attrs[k] >= 0 for k in TIMINGS), attrs
    assert attrs["gen_ai.latency.time_in_model_forward"] > 0
    assert attrs["vllm.latency.time_in_tokenizer"] > 0  # texts tokenized by the engine loop
    assert attrs["gen_ai.latency.time_in_model_inference"] >= \
        attrs["gen_ai.latency.time_in_model_forward"]
    assert attrs["gen_ai.latency.e2e"] >= attrs["gen_ai.latency.time_in_model_inference"]
    assert span.end_time_unix_nano > span.start_time_unix_nano
    # Without a traceparent the span starts a trace of its own.
    root = by_path["/score"]
    assert root.parent_span_id == b"" and root.trace_id.hex() != TRACE_ID
    root_attrs = _attrs(root)
    assert root_attrs["vllm.latency.time_in_tokenizer"] > 0  # pairs: the tokenizer thread
    assert root_attrs["gen_ai.usage.prompt_tokens"] == pairs.json()["usage"]["prompt_tokens"]


def test_spans_over_grpc(minilm_engine, monkeypatch):
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
    collector = Collector()

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802 (the proto's name)
            collector.receive(request.SerializeToString())
            return trace_service_pb2.ExportTraceServiceResponse()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    server = _traced_server(minilm_engine, f"http://127.0.0.1:{port}", monkeypatch, "grpc")
    try:
        header = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        assert server.post("/pooling", {"input": "hello"}, headers=header).status_code == 200
        span = collector.wait_for(1)[0]
    finally:
        server.close()
        server.app.state.tracer.shutdown()
        grpc_server.stop(0)
    assert span.parent_span_id.hex() == PARENT_ID
    assert _attrs(span)["gen_ai.latency.time_in_model_forward"] > 0


def test_untraced_outputs_carry_no_timing(minilm):
    """Without --otlp-traces-endpoint the engine times nothing."""
    assert minilm.app.state.tracer is None
    assert minilm.engine._timer.active is False
    assert minilm.post("/v1/embeddings", {"input": "x"}).status_code == 200


def test_flags_and_refusals(monkeypatch):
    args = parse_serve_args(["--otlp-traces-endpoint", "http://127.0.0.1:4317",
                             "--collect-detailed-traces", "model,worker"])
    assert args.collect_detailed_traces == [["model", "worker"]]
    assert check_tracing_args(args) == "http://127.0.0.1:4317"
    with pytest.raises(SystemExit):
        parse_serve_args(["--collect-detailed-traces", "everything"])
    with pytest.raises(ValueError, match="needs --otlp-traces-endpoint"):
        check_tracing_args(parse_serve_args(["--collect-detailed-traces", "all"]))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="not supported"):
        check_tracing_args(args)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    monkeypatch.setitem(__import__("sys").modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(ValueError, match=r'\.\[otel\]'):
        check_tracing_args(args)


def test_data_parallel_requests_are_traced(qwen3_embed_dir, http_collector, monkeypatch):
    """Replicas run in other processes: the span counts the prompts and their tokens, with
    no engine timings; /health's replica report is orjson's JSON too."""
    import orjson

    from vllm.engine.arg_utils import EngineArgs
    from vllm.scaleout.dp_engine import DPAsyncLLM
    engine = DPAsyncLLM.start(EngineArgs.from_kwargs(qwen3_embed_dir), 2, "mp")
    server = _traced_server(engine, http_collector.url, monkeypatch, "http/protobuf")
    try:
        header = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        r = server.post("/v1/embeddings", {"input": [[1, 2, 3], [4, 5]]}, headers=header)
        assert r.status_code == 200
        health = server.client.get("/health")
        assert health.status_code == 200 and health.content == orjson.dumps(health.json())
        span = http_collector.wait_for(1)[0]
    finally:
        server.close()
        server.app.state.tracer.shutdown()
        engine.shutdown()
    assert span.parent_span_id.hex() == PARENT_ID
    attrs = _attrs(span)
    assert attrs["vllm.request.num_prompts"] == 2 and attrs["gen_ai.usage.prompt_tokens"] == 5
    assert attrs["gen_ai.latency.time_in_model_forward"] == 0.0
