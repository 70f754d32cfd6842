"""Rerank of long documents by windows: a document's score is the best (query, window) score.
References: windows cut by hand from the tokenizer's ids, scored one by one by transformers."""
from __future__ import annotations

import pytest

import model_factory as mf
from servers import Server, _engine
from test_server import _ok

LONG = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi pi rho"


def _serve(path, **kwargs):
    engine = _engine(path, **kwargs)
    return engine, Server(engine)


def _window_scores(path, q_ids, d_ids, room, prefix, suffix, mid, typed):
    scores, tokens = [], 0
    for start in range(0, len(d_ids), room):
        window = d_ids[start:start + room]
        ids = [*prefix, *q_ids, *mid, *window, *suffix]
        types = [0] * (len(prefix) + len(q_ids) + len(mid)) + [1] * (len(window) + len(suffix))
        logits = mf.hf_seqcls_logits(path, ids, types if typed else None)
        scores.append(float(mf.probs_from_logits(logits)[0]))
        tokens += len(ids)
    return scores, tokens


def test_cross_encoder_windows(bert_cls_dir):
    engine, server = _serve(bert_cls_dir, max_model_len=16)
    try:
        body = {"query": "beta gamma", "documents": [LONG, "eta theta"]}
        too_long = server.post("/rerank", body)
        windowed = _ok(server.post("/rerank", {**body, "max_chunks_per_doc": 8}))
        capped = _ok(server.post("/rerank", {**body, "max_chunks_per_doc": 1}))
        bad = server.post("/rerank", {**body, "max_chunks_per_doc": 2,
                                      "max_tokens_per_doc": 3})
    finally:
        server.close()
        engine.shutdown()
    assert too_long.status_code == 400
    tok = mf.hf_tokenizer(bert_cls_dir)
    q = tok("beta gamma", add_special_tokens=False)["input_ids"]
    d = tok(LONG, add_special_tokens=False)["input_ids"]
    cls, sep = [tok.cls_token_id], [tok.sep_token_id]
    scores, tokens = _window_scores(bert_cls_dir, q, d, 16 - len(q) - 3, cls, sep, sep, True)
    short, short_tokens = _window_scores(bert_cls_dir, q, tok("eta theta", add_special_tokens=
                                         False)["input_ids"], 16, cls, sep, sep, True)
    got = {r["index"]: r["relevance_score"] for r in windowed["results"]}
    assert got[0] == pytest.approx(max(scores), abs=1e-5)
    assert got[1] == pytest.approx(short[0], abs=1e-5)
    assert windowed["usage"]["prompt_tokens"] == tokens + short_tokens
    first = {r["index"]: r["relevance_score"] for r in capped["results"]}
    assert first[0] == pytest.approx(scores[0], abs=1e-5)  # one window: the document's start
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens_per_doc"


def test_causal_windows_reuse_the_cached_query(qwen3_cls_dir):
    engine, server = _serve(qwen3_cls_dir, max_model_len=40, rerank_max_chunks_per_doc=4)
    tok = mf.hf_tokenizer(qwen3_cls_dir)
    assert tok.num_special_tokens_to_add(pair=True) == 0  # a plain concatenation
    query = mf.text_of_length(tok, 20, seed=5)
    doc = mf.text_of_length(tok, 70, seed=6)
    try:
        before = engine.stats
        out = _ok(server.post("/rerank", {"query": query, "documents": [doc]}))  # default
        after = engine.stats
    finally:
        server.close()
        engine.shutdown()
    q = tok(query)["input_ids"]
    d = tok(doc, add_special_tokens=False)["input_ids"]
    scores, tokens = _window_scores(qwen3_cls_dir, q, d, 40 - len(q), [], [], [], False)
    assert len(scores) > 1
    assert out["results"][0]["relevance_score"] == pytest.approx(max(scores), abs=1e-5)
    assert out["usage"]["prompt_tokens"] == tokens
    # the query's full blocks were computed once: every later window found them cached
    assert after.prefix_cache_hits - before.prefix_cache_hits >= (len(scores) - 1) * (
        len(q) // 16) * 16
    assert after.computed_tokens - before.computed_tokens == tokens - (len(scores) - 1) * (
        len(q) // 16) * 16
