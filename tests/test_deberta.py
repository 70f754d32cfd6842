"""DeBERTa-v2/v3 cross-encoders: `LLM.score`, `/score` and `/rerank` equal
sentence-transformers' `CrossEncoder.predict` (sigmoid for one label), float32.

The v3-style tiny model buckets relative positions in 16 log buckets (exact only within
+-8 tokens), so pairs of 100-200 tokens exercise the log range of the disentangled
attention; the v2-style one uses separate position projections and absolute positions.
"""
from __future__ import annotations

import numpy as np
import pytest

import family_models as fm
import model_factory as mf
from servers import Server, _engine

PROB_TOL = 1e-4


@pytest.fixture(scope="module")
def pairs(deberta_ce_dir):
    tok = mf.hf_tokenizer(deberta_ce_dir)
    query = mf.text_of_length(tok, 40, seed=7)
    docs = ["a river is water", mf.text_of_length(tok, 150, seed=8),
            mf.text_of_length(tok, 60, seed=9), "cat"]
    return query, docs


def _cross_encoder(model_dir: str, query: str, docs: list[str]) -> np.ndarray:
    from sentence_transformers import CrossEncoder
    ce = CrossEncoder(model_dir, device="cpu")
    return np.asarray(ce.predict([(query, d) for d in docs], batch_size=2))


def test_deberta_score_matches_cross_encoder(shared_llm, deberta_ce_dir, pairs):
    query, docs = pairs
    llm = shared_llm(deberta_ce_dir)
    assert not llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    outs = llm.score(query, docs, use_tqdm=False)
    assert max(len(o.prompt_token_ids) for o in outs) > 180  # far past the exact +-8 range
    expected = _cross_encoder(deberta_ce_dir, query, docs)
    np.testing.assert_allclose([o.outputs.score for o in outs], expected, atol=PROB_TOL)


def test_deberta_relative_positions_matter(deberta_ce_dir, pairs):
    """Without the disentangled position terms the long pair scores differently."""
    query, docs = pairs
    ids = mf.hf_tokenizer(deberta_ce_dir)(query, docs[1])["input_ids"]
    with_rel = fm.hf_logits(deberta_ce_dir, ids)
    without = fm.hf_logits(deberta_ce_dir, ids, relative_attention=False)
    assert abs(float(with_rel[0]) - float(without[0])) > 1e-2


def test_deberta_v2_classifier_matches_transformers(shared_llm, deberta_nli_dir):
    llm = shared_llm(deberta_nli_dir)
    for out in llm.classify(mf.mixed_prompts(mf.hf_tokenizer(deberta_nli_dir)), use_tqdm=False):
        ref = mf.probs_from_logits(fm.hf_logits(deberta_nli_dir, out.prompt_token_ids))
        assert mf.max_abs_diff(out.outputs.probs, ref) <= PROB_TOL


def test_deberta_score_and_rerank_routes(deberta_ce_dir, pairs):
    query, docs = pairs
    expected = _cross_encoder(deberta_ce_dir, query, docs)
    engine = _engine(deberta_ce_dir)
    server = Server(engine)
    try:
        r = server.post("/score", {"text_1": query, "text_2": docs})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose([d["score"] for d in r.json()["data"]], expected,
                                   atol=PROB_TOL)
        r = server.post("/rerank", {"query": query, "documents": docs})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["index"] for x in results] == list(np.argsort(-expected))
        np.testing.assert_allclose([x["relevance_score"] for x in results],
                                   np.sort(expected)[::-1], atol=PROB_TOL)
    finally:
        server.close()
        engine.shutdown()
