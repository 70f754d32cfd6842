"""Hostile input never stops the engine: lone surrogates in every text field are a 400
naming the field, internal failures are a 500 with an error id and no internals, and a
canary request after the hostile ones is still answered correctly."""
from __future__ import annotations

import asyncio
import logging
import socket
import time
import types

import httpx

import numpy as np
import pytest

from servers import Server

LONE = "\\ud800"          # JSON's escape for a lone high surrogate
RAW = b"\xed\xa0\x80"      # the same code point as raw (invalid UTF-8) bytes


def _post_raw(server, path: str, body: bytes):
    return server.client.post(path, content=body,
                              headers={"content-type": "application/json"})


def _assert_text_error(response, param: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "BadRequestError"
    assert error["code"] == 400
    assert "lone UTF-16 surrogate" in error["message"] and f"`{param}`" in error["message"]


def _canary(server, reference: list[float]) -> None:
    assert server.client.get("/health").status_code == 200
    got = server.post("/v1/embeddings", {"input": "hello there"}).json()["data"][0]
    np.testing.assert_allclose(got["embedding"], reference, atol=1e-5)


EMBED_BODIES = [
    ("/v1/embeddings", '{"input": "%s"}', "input"),
    ("/v1/embeddings", '{"input": ["fine", "x%s"]}', "input"),
    ("/v1/embeddings", '{"input": "%s", "add_special_tokens": false}', "input"),
    ("/v1/embeddings", '{"input": "ok", "model": "%s"}', "model"),
    ("/v1/embeddings", '{"input": "ok", "user": "%s"}', "user"),
    ("/pooling", '{"input": "a%sb"}', "input"),
    ("/score", '{"text_1": "%s", "text_2": "b"}', "text_1"),
    ("/score", '{"text_1": "a", "text_2": ["b", "%s"]}', "text_2"),
    ("/rerank", '{"query": "%s", "documents": ["b"]}', "query"),
    ("/v1/rerank", '{"query": "a", "documents": ["b", "%s"]}', "documents"),
    ("/tokenize", '{"prompt": "%s"}', "prompt"),
]


@pytest.mark.parametrize("encoding", ["escape", "raw"])
def test_lone_surrogates_are_a_400_naming_the_field(minilm, minilm_llm, encoding):
    reference = minilm_llm.embed(["hello there"])[0].outputs.embedding
    for path, template, param in EMBED_BODIES:
        body = (template % LONE).encode() if encoding == "escape" else \
            template.replace("%s", "\x00").encode().replace(b"\x00", RAW)
        _assert_text_error(_post_raw(minilm, path, body), param)
    _canary(minilm, reference)


def test_lone_surrogates_on_cross_encoder_routes(cross_encoder):
    for path, body, param in [
            ("/classify", '{"input": ["a", "%s"]}', "input"),
            ("/score", '{"text_1": "q", "text_2": ["%s"]}', "text_2"),
            ("/rerank", '{"query": "q%s", "documents": ["d"]}', "query"),
            ("/v2/rerank", '{"query": "q", "documents": ["%s"]}', "documents")]:
        _assert_text_error(_post_raw(cross_encoder, path, (body % LONE).encode()), param)
    ok = cross_encoder.post("/rerank", {"query": "q", "documents": ["d", "e"]})
    assert ok.status_code == 200 and len(ok.json()["results"]) == 2
    assert cross_encoder.client.get("/health").status_code == 200


def test_offline_api_names_the_bad_text(minilm_llm):
    with pytest.raises(ValueError, match="lone UTF-16 surrogate .U\\+DFFF at character 1"):
        minilm_llm.embed(["fine", "a\udfffb"])
    assert len(minilm_llm.embed(["fine"])[0].outputs.embedding) == 384


def test_engine_loop_survives_a_tokenizer_that_raises(minilm, minilm_engine, minilm_llm,
                                                      monkeypatch):
    """Whatever the batch tokenizer raises on the engine thread (here a TypeError, as Hugging
    Face's does on surrogates) fails only the texts it was given, never the loop."""
    reference = minilm_llm.embed(["hello there"])[0].outputs.embedding
    processor = minilm_engine.engine.processor
    real = processor.tokenizer

    class Exploding:
        def __call__(self, texts, *a, **k):
            if any("boom" in t for t in ([texts] if isinstance(texts, str) else texts)):
                raise TypeError("TextEncodeInput must be Union[...] (internal)")
            return real(texts, *a, **k)

        def __getattr__(self, name):
            return getattr(real, name)
    monkeypatch.setattr(processor, "tokenizer", Exploding())
    bad = minilm.post("/v1/embeddings", {"input": ["boom", "fine"]})
    assert bad.status_code == 400, bad.text
    assert "TypeError" not in bad.text and "TextEncodeInput" not in bad.text
    assert minilm_engine.is_alive
    monkeypatch.undo()
    _canary(minilm, reference)


def test_internal_errors_carry_an_id_and_no_internals(cross_encoder, monkeypatch, caplog):
    """A failure that is not the input's fault is a 500 whose message has an error id and no
    exception type, text or path; the log has the detail under the same id."""
    engine = cross_encoder.engine

    def broken(*args, **kwargs):
        raise KeyError("/secret/path/tokenizer.json")
    monkeypatch.setattr(engine.processor, "tokenize_pair", broken)
    monkeypatch.setattr(logging.getLogger("vllm"), "propagate", True)  # to caplog
    with caplog.at_level(logging.ERROR):
        response = cross_encoder.post("/score", {"text_1": "a", "text_2": "b"})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "InternalServerError" and error["code"] == 500
    for leak in ("KeyError", "secret", "tokenizer.json"):
        assert leak not in error["message"]
    error_id = error["message"].split("error id is ")[1].split(";")[0]
    assert any(error_id in r.getMessage() and r.exc_info for r in caplog.records)
    monkeypatch.undo()
    assert cross_encoder.post("/score", {"text_1": "a", "text_2": "b"}).status_code == 200


# ----- the HTTP edge ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def edge(minilm_engine):
    """MiniLM behind a 1 s body deadline, a 64 KiB body limit and a CORS origin list."""
    server = Server(minilm_engine, served_model_name=["minilm"], body_read_timeout=1.0,
                    max_request_body_bytes=65536, allowed_origins=["https://app.example"])
    yield server
    server.close()


def _raw(server, request: bytes, body_chunks=(), pause: float = 0.0) -> bytes:
    """Send raw bytes on a fresh connection; return everything the server answers."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        try:
            for chunk in body_chunks:
                sock.sendall(chunk)
                time.sleep(pause)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        while b"\r\n\r\n" not in answer or not _complete(answer):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    return answer


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    length = [int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
              if line.startswith(b"content-length:")]
    return bool(length) and len(body) >= length[0]


def test_a_body_that_never_arrives_is_a_408(edge):
    start = time.monotonic()
    answer = _raw(edge, b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: 1000\r\n\r\n{\"input\": ")
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"--body-read-timeout" in answer and time.monotonic() - start < 8
    assert edge.post("/v1/embeddings", {"input": "canary"}).status_code == 200


def test_an_oversized_body_gets_its_413_not_a_reset(edge):
    """The client keeps sending a body over the limit: it still reads the 413."""
    size = 3 * 65536
    head = (f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()
    for _ in range(5):
        answer = _raw(edge, head, [b"x" * 16384] * (size // 16384))
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"PayloadTooLargeError" in answer


def test_a_trailing_slash_serves_the_route_and_never_redirects(edge):
    response = edge.client.post("/v1/embeddings/", json={"input": "a"},
                                headers={"Host": "evil.example"})
    assert response.status_code == 200 and "location" not in response.headers
    assert len(response.json()["data"][0]["embedding"]) == 384
    assert edge.client.get("/health/").status_code == 200


def test_cors_preflight_and_headers(edge):
    preflight = edge.client.options("/v1/embeddings", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,authorization"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    other = edge.client.options("/v1/embeddings", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert other.status_code == 400
    simple = edge.client.post("/v1/embeddings", json={"input": "a"},
                              headers={"Origin": "https://app.example"})
    assert simple.headers["access-control-allow-origin"] == "https://app.example"


def test_cors_default_allows_any_origin(minilm):
    response = minilm.client.post("/v1/embeddings", json={"input": "a"},
                                  headers={"Origin": "https://anywhere.example"})
    assert response.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("method,body", [("POST", b'{"input": '), ("POST", b'{"input": "a"}'),
                                         ("GET", None)])
def test_an_unsupported_route_is_404_before_the_body(minilm, method, body):
    response = minilm.client.request(method, "/classify", content=body,
                                     headers={"content-type": "application/json"})
    assert response.status_code == 404, response.text
    assert "POST /v1/embeddings" in response.json()["error"]["message"]


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_post_that_is_not_json_is_a_400(minilm, ctype):
    headers = {} if ctype is None else {"content-type": ctype}
    response = minilm.client.post("/v1/embeddings", content=b'{"input": "a"}',
                                  headers=headers)
    assert response.status_code == 400
    assert "Only 'application/json' is allowed" in response.json()["error"]["message"]
    ok = minilm.client.post("/v1/embeddings", content=b'{"input": "a"}',
                            headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


# ----- compatibility gaps ------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [("max_tokens_per_doc", 5), ("chat_template", "x"),
                                         ("mm_processor_kwargs", {})])
def test_upstream_fields_not_implemented_are_refused_by_name(minilm, field, value):
    response = minilm.post("/v1/embeddings", {"input": "a", field: value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == field and f"`{field}` is not supported" in error["message"]
    plain_extra = minilm.post("/v1/embeddings", {"input": "a", "something_else": 1})
    assert plain_extra.status_code == 200


def test_request_id_field_names_the_response(minilm):
    body = minilm.post("/v1/embeddings", {"input": "a", "request_id": "abc123"}).json()
    assert body["id"] == "embd-abc123"


def test_tiktoken_ids_get_the_langchain_hint(minilm):
    response = minilm.post("/v1/embeddings", {"input": [[8134, 1917, 100264]]})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "out of vocabulary (vocab size 30522)" in message
    assert "check_embedding_ctx_length=False" in message
    negative = minilm.post("/v1/embeddings", {"input": [[101, -3]]}).json()["error"]
    assert "check_embedding_ctx_length" not in negative["message"]


def test_too_long_input_keeps_upstream_wording(minilm):
    error = minilm.post("/v1/embeddings", {"input": "word " * 600}).json()["error"]
    assert "maximum context length is 256 tokens" in error["message"]
    assert "Please reduce the length of the input prompt" in error["message"]


@pytest.mark.parametrize("names", [("text_1", "text_2"), ("queries", "documents"),
                                   ("queries", "items"), ("data_1", "data_2")])
def test_score_spellings_give_the_same_answer(cross_encoder, names):
    want = cross_encoder.post("/score", {"text_1": "q", "text_2": ["d1", "d2"]}).json()
    got = cross_encoder.post("/score", {names[0]: "q", names[1]: ["d1", "d2"]}).json()
    assert [d["score"] for d in got["data"]] == [d["score"] for d in want["data"]]
    rerank = cross_encoder.post("/rerank", {names[0]: "q", names[1]: ["d1", "d2"]}).json()
    assert sorted(r["relevance_score"] for r in rerank["results"]) == \
        sorted(d["score"] for d in want["data"])


def test_both_spellings_at_once_are_refused(cross_encoder):
    response = cross_encoder.post("/score", {"text_1": "q", "queries": "q", "text_2": "d"})
    assert response.status_code == 400
    assert "either `text_1` or `queries`" in response.json()["error"]["message"]


def test_invocations_dispatch_by_body_shape(minilm, cross_encoder):
    embed = minilm.post("/invocations", {"input": ["a", "b"]}).json()
    direct = minilm.post("/v1/embeddings", {"input": ["a", "b"]}).json()
    assert embed["object"] == "list" and embed["id"].startswith("embd-")
    assert [d["embedding"] for d in embed["data"]] == [d["embedding"] for d in direct["data"]]
    score = minilm.post("/invocations", {"text_1": "a", "text_2": "b"}).json()
    assert score["data"][0]["score"] == \
        minilm.post("/score", {"text_1": "a", "text_2": "b"}).json()["data"][0]["score"]
    rerank = cross_encoder.post("/invocations", {"query": "q", "documents": ["d"]}).json()
    assert rerank["id"].startswith("rerank-") and len(rerank["results"]) == 1
    classify = cross_encoder.post("/invocations", {"input": "x"}).json()
    assert classify["id"].startswith("classify-")
    bad = minilm.post("/invocations", {"nothing": 1})
    assert bad.status_code == 400 and "matches no route" in bad.json()["error"]["message"]
    invalid = minilm.post("/invocations", {"input": 5})
    assert invalid.status_code == 400 and invalid.json()["error"]["param"] == "input"


def test_pooling_task_field(minilm):
    embed = minilm.post("/pooling", {"input": "a", "task": "embed"}).json()
    want = minilm.post("/v1/embeddings", {"input": "a"}).json()["data"][0]["embedding"]
    np.testing.assert_allclose(embed["data"][0]["data"], want, atol=1e-6)
    raw = minilm.post("/pooling", {"input": "a"}).json()["data"][0]["data"]
    assert not np.allclose(raw, want)   # encode: not normalised
    bad = minilm.post("/pooling", {"input": "a", "task": "classify"})
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["param"] == "task"
    assert error["message"].startswith("Unsupported task: 'classify' Supported tasks:")
    plugin = minilm.post("/pooling", {"input": "a", "task": "plugin"})
    assert plugin.status_code == 400 and plugin.json()["error"]["param"] == "task"
    assert plugin.json()["error"]["message"].startswith("No IOProcessor plugin installed.")


# ----- overload ----------------------------------------------------------------------------
def test_a_full_queue_answers_503_with_retry_after_at_once():
    """With the engine busy on a held step, a request that would overfill the waiting
    queue is answered 503 + Retry-After at once; an idle server takes any one request."""
    from test_async_llm import FakeEngine
    from vllm.engine.async_llm import AsyncLLM
    from vllm.entrypoints.openai.api_server import build_app
    from vllm.config.pooler import PoolerConfig
    engine = FakeEngine()
    engine.vllm_config.model_config.pooler_config = PoolerConfig(normalize=True)
    llm = AsyncLLM(engine)
    args = types.SimpleNamespace(served_model_name=["fake"], max_waiting_requests=3)
    app = build_app(llm, args)

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            big = await http.post("/v1/embeddings", json={"input": ["a"] * 5})
            assert big.status_code == 200   # idle: one request over the bound is taken
            engine.gate.clear()
            engine.in_step.clear()
            held = asyncio.ensure_future(http.post("/v1/embeddings", json={"input": ["a", "b"]}))
            while not engine.in_step.is_set():
                await asyncio.sleep(0.001)
            start = time.monotonic()
            full = await http.post("/v1/embeddings", json={"input": ["c", "d"]})
            waited = time.monotonic() - start
            fits = asyncio.ensure_future(http.post("/v1/embeddings", json={"input": "e"}))
            await asyncio.sleep(0.05)
            engine.gate.set()
            return full, waited, await held, await fits

    try:
        full, waited, held, fits = asyncio.run(main())
    finally:
        llm.shutdown()
    assert full.status_code == 503 and full.headers["retry-after"] == "1"
    assert "--max-waiting-requests 3" in full.json()["error"]["message"] and waited < 1
    assert held.status_code == 200 and fits.status_code == 200


def test_per_request_caps_are_a_400_naming_the_limit(minilm_engine):
    server = Server(minilm_engine, served_model_name=["m"], max_inputs_per_request=4,
                    max_tokens_per_request=40)
    try:
        many = server.post("/v1/embeddings", {"input": ["a"] * 5})
        assert many.status_code == 400 and many.json()["error"]["param"] == "input"
        assert "--max-inputs-per-request" in many.json()["error"]["message"]
        pairs = server.post("/score", {"text_1": "q", "text_2": ["d"] * 5})
        assert pairs.status_code == 400
        long = server.post("/v1/embeddings", {"input": ["word " * 30, "word " * 30]})
        assert long.status_code == 400
        total = 2 * len(minilm_engine.tokenizer("word " * 30)["input_ids"])
        assert f"{total} tokens in all" in long.json()["error"]["message"]
        ids = server.post("/v1/embeddings", {"input": [[101] * 41]})
        assert ids.status_code == 400 and "--max-tokens-per-request" in ids.text
        ok = server.post("/v1/embeddings", {"input": ["word " * 10, "a", "b", "c"]})
        assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] <= 40
    finally:
        server.close()


# ----- memory ------------------------------------------------------------------------------
def test_heap_trimmer_waits_for_idleness_and_keeps_its_interval():
    from vllm.platforms.cpu_malloc import HeapTrimmer
    calls = []
    trimmer = HeapTrimmer(lambda pad: calls.append(pad) or 1, idle_s=0.5, interval_s=10.0)
    assert trimmer.delay() == 0.5       # never trimmed: after half a second of idleness
    trimmer()
    assert calls == [0] and trimmer.num_trims == 1
    assert 9.0 < trimmer.delay() <= 10.0  # the next one keeps the interval
    real = HeapTrimmer.create()
    assert real is not None             # glibc here
    real()                              # the real malloc_trim(0) runs and returns
    assert real.num_trims == 1


class _IdleProbe:
    """An IdleTask that records when it ran."""

    def __init__(self, delay: float) -> None:
        self._delay, self.runs = delay, []

    def delay(self) -> float:
        return self._delay

    def __call__(self) -> None:
        self.runs.append(time.monotonic())


def test_the_engine_runs_its_housekeeping_when_idle_never_while_busy():
    """Back-to-back requests for 0.6 s never leave the engine idle 0.3 s: no run. Once they
    stop, it runs once after 0.3 s, and not again until a step has run."""
    from test_async_llm import FakeEngine
    from vllm.engine.async_llm import AsyncLLM
    probe = _IdleProbe(0.3)
    llm = AsyncLLM(FakeEngine(), on_idle=probe)

    async def traffic() -> None:
        end, i = time.monotonic() + 0.6, 0
        while time.monotonic() < end:
            await llm.encode("p", None, f"r{i}")
            i += 1
    try:
        asyncio.run(traffic())
        stopped = time.monotonic()
        assert probe.runs == []
        deadline = stopped + 5
        while not probe.runs and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(probe.runs) == 1 and probe.runs[0] - stopped >= 0.25
        time.sleep(0.7)
        assert len(probe.runs) == 1     # no step since: nothing to tidy
        asyncio.run(llm.encode("p", None, "again"))
        time.sleep(0.6)
        assert len(probe.runs) == 2
    finally:
        llm.shutdown()


def test_vllm_serve_exits_1_when_its_engine_dies(monkeypatch):
    """run_server (what `vllm serve` runs) with an engine whose device is gone: the request
    in flight is answered (500 with an error id), the self-test fails, and the server stops
    with exit status 1 for its supervisor."""
    import threading

    from test_async_llm import FakeEngine
    from vllm.config.pooler import PoolerConfig
    from vllm.engine.async_llm import AsyncLLM
    from vllm.entrypoints.openai import api_server, cli_args

    engine = FakeEngine()
    engine.vllm_config.model_config.pooler_config = PoolerConfig(normalize=True)
    engine.failing_steps = 10 ** 6
    monkeypatch.setattr(AsyncLLM, "from_engine_args", classmethod(lambda cls, a: cls(engine)))
    port_sock = socket.socket()
    port_sock.bind(("127.0.0.1", 0))
    port = port_sock.getsockname()[1]
    port_sock.close()
    args = cli_args.parse_serve_args(["--port", str(port), "--disable-uvicorn-access-log",
                                      "--uvicorn-log-level", "warning"])
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(api_server.run_server(args)))
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        first = httpx.post(url + "/v1/embeddings", json={"input": "a"}, timeout=10)
        assert first.status_code == 500 and "error id" in first.json()["error"]["message"]
        thread.join(40)
        assert not thread.is_alive() and status == [1]
    finally:
        engine.failing_steps = 0
        thread.join(5)


def test_a_large_embedding_response_is_streamed_and_equal(minilm):
    """More than STREAM_MIN_ITEMS inputs: the JSON is sent item by item, and it is the same
    answer as the same inputs in small requests."""
    from vllm.entrypoints.openai.serving_engine import STREAM_MIN_ITEMS
    texts = [f"text number {i}" for i in range(STREAM_MIN_ITEMS + 44)]
    big = minilm.post("/v1/embeddings", {"input": texts})
    assert big.status_code == 200 and "content-length" not in big.headers  # streamed
    body = big.json()
    assert list(body) == ["id", "object", "created", "model", "usage", "data"]
    halves = [minilm.post("/v1/embeddings", {"input": part}).json()
              for part in (texts[:150], texts[150:])]
    want = [d["embedding"] for h in halves for d in h["data"]]
    assert [d["index"] for d in body["data"]] == list(range(len(texts)))
    np.testing.assert_allclose([d["embedding"] for d in body["data"]], want, atol=1e-5)
    assert body["usage"]["prompt_tokens"] == sum(h["usage"]["prompt_tokens"] for h in halves)


@pytest.mark.parametrize("route", ["/pooling", "/classify", "/invocations"])
def test_large_pooling_and_classify_answers_are_streamed_and_equal(classifier3, route):
    """/pooling and /classify (directly and through /invocations) stream past
    STREAM_MIN_ITEMS items too, with the same JSON as small requests."""
    from vllm.entrypoints.openai.serving_engine import STREAM_MIN_ITEMS
    texts = [f"review {i}: fine" for i in range(STREAM_MIN_ITEMS + 10)]
    big = classifier3.post(route, {"input": texts})
    assert big.status_code == 200 and "content-length" not in big.headers, big.text[:300]
    key = "data" if route == "/pooling" else "probs"
    small_route = "/pooling" if route == "/pooling" else "/classify"
    parts = [classifier3.post(small_route, {"input": p}).json()
             for p in (texts[:100], texts[100:])]
    want = [d[key] for part in parts for d in part["data"]]
    got = big.json()["data"]
    assert [d["index"] for d in got] == list(range(len(texts)))
    # Other batches, so other GEMM blockings: equal up to float32 rounding.
    np.testing.assert_allclose([d[key] for d in got], want, atol=1e-5)


def test_invocations_answers_compact_encodings(minilm):
    """/invocations passes non-JSON-model answers (base64 / bytes) through unchanged."""
    body = {"input": ["one text", "two texts"], "encoding_format": "base64"}
    via = minilm.post("/invocations", body)
    direct = minilm.post("/v1/embeddings", body)
    assert via.status_code == 200, via.text[:300]
    assert [d["embedding"] for d in via.json()["data"]] == \
        [d["embedding"] for d in direct.json()["data"]]
