"""Hugging Face TEI's HTTP API on the same server: shapes, numbers equal to the engine's own
OpenAI-style routes, TEI's error body and codes, headers and te_* metrics. Uses the
session servers (MiniLM, a one-label cross-encoder, a three-label classifier)."""
from __future__ import annotations

import math

import pytest

TEXTS = ["The cat sat on the mat.", "A quick brown fox", "Paris is in France"]
HEADERS = ("x-compute-type", "x-compute-time", "x-compute-characters", "x-compute-tokens",
           "x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time")


def close(a, b, tol=1e-5) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, abs_tol=tol) for x, y in zip(a, b))


def tei_error(response, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == error_type
    return body["error"]


def test_embed_equals_openai_embeddings(minilm):
    tei = minilm.post("/embed", {"inputs": TEXTS})
    assert tei.status_code == 200
    ref = minilm.post("/v1/embeddings", {"input": TEXTS}).json()["data"]
    assert all(close(v, r["embedding"]) for v, r in zip(tei.json(), ref))
    single = minilm.post("/embed", {"inputs": TEXTS[0]}).json()
    assert len(single) == 1 and close(single[0], ref[0]["embedding"])
    for name in HEADERS:
        assert name in tei.headers, name
    assert tei.headers["x-compute-characters"] == str(sum(map(len, TEXTS)))
    assert int(tei.headers["x-compute-tokens"]) > len(TEXTS)


def test_embed_options(minilm):
    raw = minilm.post("/embed", {"inputs": "hello", "normalize": False}).json()[0]
    ref = minilm.post("/v1/embeddings", {"input": "hello", "normalize": False}).json()
    assert close(raw, ref["data"][0]["embedding"])
    left = minilm.post("/embed", {"inputs": "word " * 400, "truncation_direction": "Left"})
    ref = minilm.post("/v1/embeddings", {"input": "word " * 400, "truncate_prompt_tokens": -1,
                                          "truncation_side": "left"}).json()
    assert close(left.json()[0], ref["data"][0]["embedding"])
    ids = minilm.post("/embed", {"inputs": [[101, 7592, 102]]}).json()
    ref = minilm.post("/v1/embeddings", {"input": [101, 7592, 102]}).json()
    assert close(ids[0], ref["data"][0]["embedding"])


def test_truncation_and_batch_refusals(minilm):
    long_text = "word " * 400
    assert minilm.post("/embed", {"inputs": long_text}).status_code == 200  # auto-truncate
    message = tei_error(minilm.post("/embed", {"inputs": long_text, "truncate": False}),
                        422, "Validation")
    assert "must have less than 256 tokens" in message
    tei_error(minilm.post("/embed", {"inputs": []}), 400, "Empty")
    message = tei_error(minilm.post("/embed", {"inputs": ["x"] * 33}), 422, "Validation")
    assert message == "batch size 33 > maximum allowed batch size 32"
    tei_error(minilm.post("/embed", {"inputz": "x"}), 422, "Validation")
    tei_error(minilm.post("/embed", {"inputs": 5}), 422, "Validation")
    tei_error(minilm.post("/embed", content=b"{not json",
                          headers={"content-type": "application/json"}), 400, "Validation")
    assert minilm.post("/v1/embeddings", {"input": []}).json()["error"]["code"] == 400


def test_wrong_model_kind_is_424(minilm, classifier3):
    for path, body in (("/predict", {"inputs": "x"}), ("/rerank", {"query": "q", "texts": ["a"]}),
                       ("/embed_all", {"inputs": "x"}), ("/embed_sparse", {"inputs": "x"})):
        tei_error(minilm.post(path, body), 424, "Backend")
    tei_error(classifier3.post("/embed", {"inputs": "x"}), 424, "Backend")
    tei_error(classifier3.post("/similarity", {"inputs": {"source_sentence": "a",
                                                           "sentences": ["b"]}}), 424, "Backend")


def test_similarity_equals_score(minilm):
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    tei = minilm.post("/similarity", body).json()
    ref = minilm.post("/score", {"text_1": TEXTS[0], "text_2": TEXTS[1:]}).json()["data"]
    assert close(tei, [d["score"] for d in ref])
    tei_error(minilm.post("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}),
              400, "Empty")


def test_rerank_equals_vllm_rerank(cross_encoder):
    tei = cross_encoder.post("/rerank", {"query": "q", "texts": TEXTS, "return_text": True})
    assert tei.status_code == 200 and "x-compute-tokens" in tei.headers
    ref = cross_encoder.post("/rerank", {"query": "q", "documents": TEXTS}).json()["results"]
    assert [r["index"] for r in tei.json()] == [r["index"] for r in ref]
    assert close([r["score"] for r in tei.json()], [r["relevance_score"] for r in ref])
    assert all(r["text"] == TEXTS[r["index"]] for r in tei.json())
    raw = cross_encoder.post("/rerank", {"query": "q", "texts": TEXTS, "raw_scores": True}).json()
    assert "text" not in raw[0]
    ref = cross_encoder.post("/score", {"text_1": "q", "text_2": TEXTS,
                                        "activation": False}).json()["data"]
    assert close(sorted(r["score"] for r in raw), sorted(d["score"] for d in ref))
    tei_error(cross_encoder.post("/rerank", {"query": "q", "texts": []}), 400, "Empty")


def test_predict_equals_classify(classifier3):
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    ref = classifier3.post("/classify", {"input": TEXTS}).json()["data"]
    batch = classifier3.post("/predict", {"inputs": [[t] for t in TEXTS]}).json()
    for preds, r in zip(batch, ref):
        scores = [p["score"] for p in preds]
        assert scores == sorted(scores, reverse=True)
        assert close([p["score"] for p in sorted(preds, key=lambda p: p["label"])],
                     [r["probs"][i] for i in sorted(labels, key=labels.get)])
    single = classifier3.post("/predict", {"inputs": TEXTS[0]}).json()
    assert isinstance(single[0], dict) and single[0]["label"] == ref[0]["label"]
    raw = classifier3.post("/predict", {"inputs": TEXTS[0], "raw_scores": True}).json()
    logits = classifier3.post("/classify", {"input": TEXTS[0], "activation": False}).json()
    assert close(sorted(p["score"] for p in raw), sorted(logits["data"][0]["probs"]))
    tei_error(classifier3.post("/predict", {"inputs": []}), 400, "Empty")
    tei_error(classifier3.post("/predict", {"inputs": ["a", "b", "c"]}), 422, "Validation")


def test_predict_pairs_on_a_reranker(cross_encoder):
    pair = cross_encoder.post("/predict", {"inputs": ["q", TEXTS[0]]}).json()
    ref = cross_encoder.post("/score", {"text_1": "q", "text_2": TEXTS[0]}).json()["data"]
    assert close([pair[0]["score"]], [ref[0]["score"]])
    mixed = cross_encoder.post("/predict", {"inputs": [["q", TEXTS[1]], [TEXTS[2]]]}).json()
    one = cross_encoder.post("/classify", {"input": TEXTS[2]}).json()["data"][0]["probs"]
    assert len(mixed) == 2 and close([mixed[1][0]["score"]], one)


def test_tokenize_and_decode(minilm):
    tokens = minilm.post("/tokenize", {"inputs": "Hello world!"}).json()
    assert len(tokens) == 1
    first, hello = tokens[0][0], tokens[0][1]
    assert first == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert hello == {"id": 7592, "text": "Hello", "special": False, "start": 0, "stop": 5}
    plain = minilm.post("/tokenize", {"inputs": ["a", "b"], "add_special_tokens": False}).json()
    assert [[t["text"] for t in ts] for ts in plain] == [["a"], ["b"]]
    vllm = minilm.post("/tokenize", {"prompt": "Hello world!"}).json()  # vLLM's shape stays
    assert vllm["tokens"] == [t["id"] for t in tokens[0]] and vllm["count"] == len(tokens[0])
    ids = [t["id"] for t in tokens[0]]
    assert minilm.post("/decode", {"ids": ids}).json() == ["hello world!"]
    both = minilm.post("/decode", {"ids": [ids, ids], "skip_special_tokens": False}).json()
    assert both[0].startswith("[CLS]") and len(both) == 2
    tei_error(minilm.post("/decode", {"ids": [[10 ** 9]]}), 422, "Tokenizer")


def test_info_ping_and_root_dispatch(minilm, cross_encoder, classifier3):
    info = minilm.client.get("/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 256 and info["max_client_batch_size"] == 32
    assert info["auto_truncate"] is True and info["model_id"] == "minilm"
    assert {"version", "max_batch_tokens", "max_concurrent_requests", "model_dtype"} <= set(info)
    kinds = [s.client.get("/info").json()["model_type"] for s in (cross_encoder, classifier3)]
    assert "reranker" in kinds[0] and kinds[1]["classifier"]["id2label"]["2"] == "positive"
    assert minilm.client.get("/ping").status_code == 200
    root = minilm.post("/", {"inputs": "x"}).json()
    assert close(root[0], minilm.post("/embed", {"inputs": "x"}).json()[0])
    ranked = cross_encoder.post("/", {"query": "q", "texts": TEXTS}).json()
    assert len(ranked) == 3 and {"index", "score"} <= set(ranked[0])
    assert classifier3.post("/", {"inputs": "x"}).json()[0]["label"] in (
        "negative", "neutral", "positive")


def test_invocations_tells_tei_bodies_apart(minilm, cross_encoder):
    tei = minilm.post("/invocations", {"inputs": ["x"]}).json()
    assert isinstance(tei, list) and isinstance(tei[0][0], float)
    assert minilm.post("/invocations", {"input": ["x"]}).json()["object"] == "list"
    ranked = cross_encoder.post("/invocations", {"query": "q", "texts": ["a", "b"]}).json()
    assert isinstance(ranked, list) and ranked[0]["index"] in (0, 1)
    assert "results" in cross_encoder.post("/invocations",
                                           {"query": "q", "documents": ["a"]}).json()


def test_te_metrics(minilm):
    minilm.post("/embed", {"inputs": ["a", "b"]})
    text = minilm.client.get("/metrics").text
    for name in ("te_request_count{", "te_request_success{", "te_request_failure{",
                 "te_request_duration_bucket", "te_request_inference_duration_count",
                 "te_batch_next_size_bucket", "vllm:http_requests_total"):
        assert name in text, name


@pytest.mark.parametrize("path", ["/embed", "/rerank", "/tokenize"])
def test_api_key_applies(secured, path):
    assert secured.post(path, {"inputs": "x"}).status_code == 401
