"""One request front: every pooling route and request option gives the numbers the offline
API gives for the same inputs (both go through vllm.engine.request_front: prompt,
verification, tokenization), on an encoder embedder (MiniLM), a cross-encoder, a
classifier and a causal LAST embedder with prefix caching on."""
from __future__ import annotations

import pytest
import torch

TEXTS = ["a short text", "the quick brown fox jumps over the lazy dog " * 3, "x"]
TOL = 1e-5


def _close(server_values, offline_values) -> None:
    a = torch.tensor(server_values, dtype=torch.float64)
    b = torch.tensor(offline_values, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, atol=TOL, rtol=0), (a - b).abs().max()


def _embeddings(resp) -> list:
    assert resp.status_code == 200, resp.text
    return [d["embedding"] for d in resp.json()["data"]]


EMBED_OPTIONS = [  # (the /v1/embeddings body's options, LLM.embed's keyword arguments)
    ({}, {}),
    ({"normalize": False}, {"pooling_params": "normalize=False"}),
    ({"truncate_prompt_tokens": 4}, {"truncate_prompt_tokens": 4}),
    ({"truncate_prompt_tokens": 4, "truncation_side": "left"},
     {"truncate_prompt_tokens": 4, "truncation_side": "left"}),
    ({"prompt": "query: "}, {"prompt": "query: "}),
    ({"padding": "max_length"}, {"tokenization_kwargs": {"padding": "max_length"}}),
    ({"precision": "int8", "ranges": [[-0.2] * 384, [0.2] * 384]},
     {"precision": "int8", "ranges": [[-0.2] * 384, [0.2] * 384]}),
]


def _offline_kwargs(kwargs: dict) -> dict:
    from vllm import PoolingParams
    if kwargs.get("pooling_params") == "normalize=False":
        return {**kwargs, "pooling_params": PoolingParams(normalize=False)}
    return kwargs


@pytest.mark.parametrize("body,kwargs", EMBED_OPTIONS, ids=lambda v: str(v)[:40])
def test_embeddings_route_equals_llm_embed(minilm, minilm_llm, body, kwargs):
    served = _embeddings(minilm.post("/v1/embeddings", {"input": TEXTS, **body}))
    offline = minilm_llm.embed(TEXTS, use_tqdm=False, **_offline_kwargs(kwargs))
    _close(served, [o.outputs.embedding for o in offline])


def test_token_ids_and_salted_prompts_equal_offline(minilm, minilm_llm):
    ids = minilm_llm.get_tokenizer()(TEXTS[1])["input_ids"]
    served = _embeddings(minilm.post("/v1/embeddings", {"input": ids, "cache_salt": "t1"}))
    offline = minilm_llm.embed([{"prompt_token_ids": ids, "cache_salt": "t1"}],
                               use_tqdm=False)
    _close(served, [offline[0].outputs.embedding])


@pytest.mark.parametrize("body", [{"task": "embed"}, {"task": "embed", "dimensions": None,
                                                       "normalize": False}])
def test_pooling_route_equals_llm_encode(minilm, minilm_llm, body):
    from vllm import PoolingParams
    resp = minilm.post("/pooling", {"input": TEXTS[:2], **body})
    assert resp.status_code == 200, resp.text
    offline = minilm_llm.encode(TEXTS[:2], use_tqdm=False, pooling_task="embed",
                                pooling_params=PoolingParams(normalize=body.get("normalize")))
    for served, o in zip(resp.json()["data"], offline):
        _close(served["data"], o.outputs.data.tolist())


def test_tei_embed_equals_llm_embed(minilm, minilm_llm):
    resp = minilm.post("/embed", {"inputs": TEXTS, "truncate": True})
    assert resp.status_code == 200, resp.text
    _close(resp.json(), [o.outputs.embedding for o in minilm_llm.embed(TEXTS,
                                                                          use_tqdm=False)])


def test_embedding_score_and_rerank_equal_llm_score(minilm, minilm_llm):
    docs = TEXTS[1:]
    offline = [o.outputs.score for o in minilm_llm.score(TEXTS[0], docs, use_tqdm=False)]
    score = minilm.post("/score", {"text_1": TEXTS[0], "text_2": docs})
    assert score.status_code == 200, score.text
    _close([d["score"] for d in score.json()["data"]], offline)
    rerank = minilm.post("/rerank", {"query": TEXTS[0], "documents": docs})
    assert rerank.status_code == 200, rerank.text
    by_index = {r["index"]: r["relevance_score"] for r in rerank.json()["results"]}
    _close([by_index[i] for i in range(len(docs))], offline)


@pytest.mark.parametrize("body,kwargs", [({}, {}), ({"truncate_prompt_tokens": 6},
                                                     {"truncate_prompt_tokens": 6})])
def test_cross_encoder_routes_equal_llm_score(cross_encoder, shared_llm, bert_cls_dir,
                                              body, kwargs):
    llm = shared_llm(bert_cls_dir)
    docs = TEXTS[1:]
    offline = [o.outputs.score for o in llm.score(TEXTS[0], docs, use_tqdm=False, **kwargs)]
    score = cross_encoder.post("/score", {"text_1": TEXTS[0], "text_2": docs, **body})
    assert score.status_code == 200, score.text
    _close([d["score"] for d in score.json()["data"]], offline)
    rerank = cross_encoder.post("/v1/rerank", {"query": TEXTS[0], "documents": docs, **body})
    assert rerank.status_code == 200, rerank.text
    by_index = {r["index"]: r["relevance_score"] for r in rerank.json()["results"]}
    _close([by_index[i] for i in range(len(docs))], offline)
    tei = cross_encoder.post("/rerank", {"query": TEXTS[0], "texts": docs})
    assert tei.status_code == 200, tei.text
    if not body:
        _close([r["score"] for r in sorted(tei.json(), key=lambda r: r["index"])], offline)


@pytest.mark.parametrize("body,activation", [({}, True), ({"use_activation": False}, False)])
def test_classify_route_equals_llm_classify(classifier3, shared_llm, bert_cls3_dir, body,
                                            activation):
    from vllm import PoolingParams
    resp = classifier3.post("/classify", {"input": TEXTS, **body})
    assert resp.status_code == 200, resp.text
    offline = shared_llm(bert_cls3_dir).classify(
        TEXTS, use_tqdm=False, pooling_params=PoolingParams(use_activation=activation))
    _close([d["probs"] for d in resp.json()["data"]], [o.outputs.probs for o in offline])
    tei = classifier3.post("/predict", {"inputs": TEXTS[0], "raw_scores": not activation})
    assert tei.status_code == 200, tei.text
    labels = classifier3.post("/classify", {"input": TEXTS[0], **body}).json()["data"][0]
    assert max(p["score"] for p in tei.json()) == pytest.approx(max(labels["probs"]),
                                                                abs=TOL)


def test_causal_last_embedder_with_prefix_caching_equals_offline(qwen3, shared_llm,
                                                                 qwen3_embed_dir):
    llm = shared_llm(qwen3_embed_dir)
    shared = "an instruction every query shares, long enough to fill a block or two: "
    texts = [shared + t for t in TEXTS]
    first = _embeddings(qwen3.post("/v1/embeddings", {"input": texts}))
    again = _embeddings(qwen3.post("/v1/embeddings", {"input": texts}))  # cached prefixes
    offline = [o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)]
    _close(first, offline)
    _close(again, offline)
