"""truncation_side (request and server default), Cohere's max_tokens_per_query/doc, and the
one place truncation is validated.

The reference is the Hugging Face tokenizer itself with `truncation_side` set (what upstream
vLLM hands its tokenizer), and hand-cut texts scored with no truncation at all.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

import model_factory as mf
from servers import Server, _engine
from test_server import _ok
from vllm import LLM

LONG = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"


def _hf_ids(path, text, k, side, pair=None):
    tok = copy.deepcopy(mf.hf_tokenizer(path))  # the cached one stays as it was
    tok.truncation_side = side
    return tok(text, pair, truncation=True, max_length=k)["input_ids"]


@pytest.mark.parametrize("name", ["bert_embed_dir", "qwen3_embed_dir"])
def test_llm_truncation_side_matches_tokenizer(name, request, shared_llm):
    path = request.getfixturevalue(name)
    llm = shared_llm(path)
    for side in ("left", "right"):
        out = llm.embed([LONG], truncate_prompt_tokens=5, truncation_side=side,
                        use_tqdm=False)[0]
        ids = _hf_ids(path, LONG, 5, side)
        assert out.prompt_token_ids == ids
        ref = llm.embed({"prompt_token_ids": ids}, use_tqdm=False)[0]
        np.testing.assert_allclose(out.outputs.embedding, ref.outputs.embedding, atol=1e-6)
    with pytest.raises(ValueError, match="truncation_side must be 'left' or 'right'"):
        llm.embed([LONG], truncate_prompt_tokens=5, truncation_side="middle", use_tqdm=False)


def test_server_default_truncation_side(bert_embed_dir):
    llm = LLM(model=bert_embed_dir, truncation_side="left")
    out = llm.embed([LONG], truncate_prompt_tokens=4, use_tqdm=False)[0]
    assert out.prompt_token_ids == _hf_ids(bert_embed_dir, LONG, 4, "left")
    right = llm.embed([LONG], truncate_prompt_tokens=4, truncation_side="right",
                      use_tqdm=False)[0]
    assert right.prompt_token_ids == _hf_ids(bert_embed_dir, LONG, 4, "right")
    with pytest.raises(ValueError, match="truncation_side must be 'left' or 'right'"):
        LLM(model=bert_embed_dir, truncation_side="middle")


@pytest.fixture(scope="module")
def cross(cross_encoder):
    return cross_encoder  # the shared tiny BERT cross-encoder server (bert_cls_dir)


def _hand_pair_score(path, query_ids, doc_ids) -> float:
    """[CLS] query [SEP] doc [SEP] built by hand, scored by transformers (sigmoid)."""
    tok = mf.hf_tokenizer(path)
    ids = [tok.cls_token_id, *query_ids, tok.sep_token_id, *doc_ids, tok.sep_token_id]
    types = [0] * (len(query_ids) + 2) + [1] * (len(doc_ids) + 1)
    return float(mf.probs_from_logits(mf.hf_seqcls_logits(path, ids, types))[0]), len(ids)


def test_rerank_max_tokens_per_doc_and_query(cross, bert_cls_dir):
    query, docs = "beta gamma delta", [LONG, "eta theta"]
    tok = mf.hf_tokenizer(bert_cls_dir)
    q_ids = tok(query, add_special_tokens=False)["input_ids"]
    d_ids = [tok(d, add_special_tokens=False)["input_ids"] for d in docs]
    for side in ("right", "left"):
        out = _ok(cross.post("/rerank", {"query": query, "documents": docs,
                                         "max_tokens_per_doc": 4, "truncation_side": side,
                                         "max_tokens_per_query": 2}))
        q = q_ids[:2] if side == "right" else q_ids[-2:]
        expected, tokens = {}, 0
        for i, ids in enumerate(d_ids):
            cut = ids if len(ids) <= 4 else ids[:4] if side == "right" else ids[-4:]
            expected[i], n = _hand_pair_score(bert_cls_dir, q, cut)
            tokens += n
        got = {r["index"]: r["relevance_score"] for r in out["results"]}
        assert got == pytest.approx(expected, abs=1e-5), side
        assert out["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    pair = _ok(cross.post("/score", {"text_1": query, "text_2": LONG,
                                     "max_tokens_per_doc": 4}))
    assert pair["data"][0]["score"] == pytest.approx(
        _hand_pair_score(bert_cls_dir, q_ids, d_ids[0][:4])[0], abs=1e-5)


def test_embedding_model_caps_each_text(shared_llm, bert_embed_dir):
    """On an embedding model each side is embedded alone, capped at its own tokens."""
    engine = _engine(bert_embed_dir)
    server = Server(engine)
    try:
        out = _ok(server.post("/rerank", {"query": "beta gamma delta", "documents": [LONG],
                                          "max_tokens_per_doc": 3, "max_tokens_per_query": 1,
                                          "truncation_side": "left"}))
    finally:
        server.close()
        engine.shutdown()
    tok = mf.hf_tokenizer(bert_embed_dir)
    q = tok("beta gamma delta", add_special_tokens=False)["input_ids"][-1:]
    d = tok(LONG, add_special_tokens=False)["input_ids"][-3:]
    llm = shared_llm(bert_embed_dir)
    emb = [llm.embed({"prompt_token_ids": [tok.cls_token_id, *ids, tok.sep_token_id]},
                     use_tqdm=False)[0].outputs.embedding for ids in (q, d)]
    expected = float(np.dot(emb[0], emb[1]) / np.linalg.norm(emb[0]) / np.linalg.norm(emb[1]))
    assert out["results"][0]["relevance_score"] == pytest.approx(expected, abs=1e-5)
    assert out["usage"]["prompt_tokens"] == len(q) + len(d) + 4


def test_pair_truncation_side_matches_tokenizer(cross, bert_cls_dir):
    body = {"text_1": "beta gamma", "text_2": LONG, "truncate_prompt_tokens": 9,
            "truncation_side": "left"}
    out = _ok(cross.post("/score", body))
    assert out["usage"]["prompt_tokens"] == 9
    ids = _hf_ids(bert_cls_dir, "beta gamma", 9, "left", pair=LONG)
    llm_out = LLM(model=bert_cls_dir).score("beta gamma", LONG, truncate_prompt_tokens=9,
                                            truncation_side="left", use_tqdm=False)[0]
    assert llm_out.prompt_token_ids == ids
    assert out["data"][0]["score"] == pytest.approx(llm_out.outputs.score, abs=1e-6)


def test_truncation_bad_input(cross):
    r = cross.post("/rerank", {"query": "a", "documents": ["b"], "max_tokens_per_doc": -1})
    assert r.status_code == 400
    assert r.json() == {"error": {
        "message": "max_tokens_per_doc must be 0 (no cap) or between 1 and max_model_len "
                   "(512); got -1.", "type": "BadRequestError", "param": "max_tokens_per_doc",
        "code": 400}}
    r = cross.post("/score", {"text_1": "a", "text_2": "b", "truncation_side": "middle"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "truncation_side" and error["code"] == 400
    assert "left" in error["message"] and "right" in error["message"]
