"""truncation_side (request and server default), Cohere's max_tokens_per_query/doc, and the
one place truncation is validated.

The references: with a side given, upstream vLLM's cut of the whole tokenization's ids
(special tokens included: "left" keeps the last k ids, "right" the first k); with none, the
Hugging Face tokenizer's own cut (special tokens kept); and hand-cut texts scored with no
truncation at all.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

import model_factory as mf
from servers import Server, _engine
from test_server import _ok
from vllm import LLM
from vllm.engine.prompt_types import TextPrompt, TokenCap

LONG = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"


def _hf_ids(path, text, k, side=None, pair=None):
    """The tokenizer's own cut to k tokens at `side` (special tokens kept)."""
    tok = copy.deepcopy(mf.hf_tokenizer(path))  # the cached one stays as it was
    if side is not None:
        tok.truncation_side = side
    return tok(text, pair, truncation=True, max_length=k)["input_ids"]


def _cut(path, text, k, side, pair=None, key="input_ids"):
    """Upstream's cut for an explicit side: the whole tokenization's ids (or token types),
    cut to k at `side`."""
    full = mf.hf_tokenizer(path)(text, pair)[key]
    return full[-k:] if side == "left" else full[:k]


@pytest.mark.parametrize("name", ["bert_embed_dir", "qwen3_embed_dir"])
def test_llm_truncation_side_cuts_ids(name, request, shared_llm):
    path = request.getfixturevalue(name)
    llm = shared_llm(path)
    for side in ("left", "right"):
        out = llm.embed([LONG], truncate_prompt_tokens=5, truncation_side=side,
                        use_tqdm=False)[0]
        ids = _cut(path, LONG, 5, side)
        assert out.prompt_token_ids == ids
        ref = llm.embed({"prompt_token_ids": ids}, use_tqdm=False)[0]
        np.testing.assert_allclose(out.outputs.embedding, ref.outputs.embedding, atol=1e-6)
    with pytest.raises(ValueError, match="truncation_side must be 'left' or 'right'"):
        llm.embed([LONG], truncate_prompt_tokens=5, truncation_side="middle", use_tqdm=False)


def test_server_default_truncation_side(bert_embed_dir):
    llm = LLM(model=bert_embed_dir, truncation_side="left")
    out = llm.embed([LONG], truncate_prompt_tokens=4, use_tqdm=False)[0]
    assert out.prompt_token_ids == _cut(bert_embed_dir, LONG, 4, "left")  # a side given
    right = llm.embed([LONG], truncate_prompt_tokens=4, truncation_side="right",
                      use_tqdm=False)[0]
    assert right.prompt_token_ids == _cut(bert_embed_dir, LONG, 4, "right")
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


def _pair_score(path, ids, types) -> float:
    return float(mf.probs_from_logits(mf.hf_seqcls_logits(path, ids, types))[0])


@pytest.mark.parametrize("side", ["left", "right"])
def test_pair_truncation_side_cuts_ids(cross, bert_cls_dir, side):
    """The whole pair's ids and token types cut to 9 at the side, as upstream."""
    body = {"text_1": "beta gamma", "text_2": LONG, "truncate_prompt_tokens": 9,
            "truncation_side": side}
    out = _ok(cross.post("/score", body))
    assert out["usage"]["prompt_tokens"] == 9
    ids = _cut(bert_cls_dir, "beta gamma", 9, side, pair=LONG)
    types = _cut(bert_cls_dir, "beta gamma", 9, side, pair=LONG, key="token_type_ids")
    assert ids != _hf_ids(bert_cls_dir, "beta gamma", 9, side, pair=LONG)
    llm_out = LLM(model=bert_cls_dir).score("beta gamma", LONG, truncate_prompt_tokens=9,
                                            truncation_side=side, use_tqdm=False)[0]
    assert llm_out.prompt_token_ids == ids
    expected = _pair_score(bert_cls_dir, ids, types)
    assert llm_out.outputs.score == pytest.approx(expected, abs=1e-5)
    assert out["data"][0]["score"] == pytest.approx(expected, abs=1e-5)


def test_pair_doc_cap_then_id_cut(cross, bert_cls_dir):
    """max_tokens_per_doc cuts the document inside the pair (only_second, at the side);
    then truncate_prompt_tokens cuts the capped pair's ids and token types at the side."""
    tok = mf.hf_tokenizer(bert_cls_dir)
    query = "beta gamma"
    doc_ids = tok(LONG, add_special_tokens=False)["input_ids"]
    q_ids = tok(query, add_special_tokens=False)["input_ids"]
    for side in ("left", "right"):
        out = _ok(cross.post("/score", {"text_1": query, "text_2": LONG,
                                        "max_tokens_per_doc": 6, "truncate_prompt_tokens": 8,
                                        "truncation_side": side}))
        doc = doc_ids[-6:] if side == "left" else doc_ids[:6]
        ids = [tok.cls_token_id, *q_ids, tok.sep_token_id, *doc, tok.sep_token_id]
        types = [0] * (len(q_ids) + 2) + [1] * (len(doc) + 1)
        ids, types = (ids[-8:], types[-8:]) if side == "left" else (ids[:8], types[:8])
        assert out["usage"]["prompt_tokens"] == 8
        assert out["data"][0]["score"] == pytest.approx(
            _pair_score(bert_cls_dir, ids, types), abs=1e-5), side


MINILM_K = 8


@pytest.mark.parametrize("side", ["left", "right"])
def test_minilm_side_cuts_ids_offline(minilm_llm, minilm_dir, side):
    """Upstream vLLM's ids for truncate_prompt_tokens=8 with a side: the last 8 ids of the
    whole tokenization (its [CLS] dropped) or the first 8 (its [SEP] dropped); the
    embedding is transformers' on exactly those ids."""
    tok = mf.hf_tokenizer(minilm_dir)
    ids = _cut(minilm_dir, LONG, MINILM_K, side)
    assert (ids[0] != tok.cls_token_id) if side == "left" else (ids[-1] != tok.sep_token_id)
    ref = mf.hf_embedding(minilm_dir, ids, "MEAN")
    one = minilm_llm.embed(LONG, truncate_prompt_tokens=MINILM_K, truncation_side=side,
                           use_tqdm=False)[0]
    batch = minilm_llm.embed([LONG, LONG + " nu"], truncate_prompt_tokens=MINILM_K,
                             truncation_side=side, use_tqdm=False)
    other = _cut(minilm_dir, LONG + " nu", MINILM_K, side)
    assert [one.prompt_token_ids, *(o.prompt_token_ids for o in batch)] == [ids, ids, other]
    for out in (one, batch[0]):
        assert mf.cosine(out.outputs.embedding, ref) >= 0.9999
    token_cut = mf.hf_embedding(minilm_dir, _hf_ids(minilm_dir, LONG, MINILM_K, side), "MEAN")
    assert mf.cosine(one.outputs.embedding, token_cut) < 0.999  # the old cut differs
    # no side: the tokenizer's own cut, [CLS] and [SEP] kept (upstream's recorded answers)
    kept = _hf_ids(minilm_dir, LONG, MINILM_K)
    assert kept[0] == tok.cls_token_id and kept[-1] == tok.sep_token_id
    none = minilm_llm.embed([LONG, LONG + " nu"], truncate_prompt_tokens=MINILM_K,
                            use_tqdm=False)
    assert [o.prompt_token_ids for o in none] == [kept, kept]


@pytest.mark.parametrize("side", ["left", "right"])
def test_minilm_side_cuts_ids_server(minilm, minilm_dir, side):
    tok = mf.hf_tokenizer(minilm_dir)
    for given, ids in ((side, _cut(minilm_dir, LONG, MINILM_K, side)),
                       (None, _hf_ids(minilm_dir, LONG, MINILM_K))):  # no side: as before
        ref = mf.hf_embedding(minilm_dir, ids, "MEAN")
        for inputs in ([LONG], [LONG, "a short one"]):  # one text, and a batch
            body = _ok(minilm.post("/v1/embeddings", {
                "input": inputs, "model": "minilm", "truncate_prompt_tokens": MINILM_K,
                **({"truncation_side": given} if given else {})}))
            assert mf.cosine(body["data"][0]["embedding"], ref) >= 0.9999, given
            assert body["usage"]["prompt_tokens"] == MINILM_K + sum(
                len(tok(t)["input_ids"]) for t in inputs[1:])


def test_processor_cap_and_long_text(minilm_llm, minilm_dir):
    """A TokenCap (an embedding model's per-text cap) keeps the special tokens even when it
    shares an engine step with an equal explicit truncation; a text longer than any the
    model takes is pre-cut by characters and still gives the whole tokenization's ids."""
    processor = minilm_llm.llm_engine.processor
    tok = mf.hf_tokenizer(minilm_dir)
    cut, cap = processor.tokenize_texts([TextPrompt(LONG, 8, "left"),
                                         TextPrompt(LONG, TokenCap(8), "left")])
    assert cut.prompt_token_ids == _cut(minilm_dir, LONG, 8, "left")
    assert cap.prompt_token_ids == _hf_ids(minilm_dir, LONG, 8, "left")
    long_text = " ".join([LONG] * 2000)  # 134k characters, far past 512 tokens
    assert len(long_text) > processor.mc.max_model_len * processor.max_chars_per_token
    full = tok(long_text)["input_ids"]
    for side in ("left", "right"):
        out = processor.tokenize_prompt(long_text, 8, truncation_side=side)
        assert out.prompt_token_ids == (full[-8:] if side == "left" else full[:8])


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
