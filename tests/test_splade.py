"""SPLADE sparse embeddings: upstream's BertSpladeSparseEmbeddingModel (config.json) and a
sentence-transformers SparseEncoder checkpoint, dense (vocabulary-size) and sparse forms.

Both tiny checkpoints tie the MLM decoder to the word embeddings, so neither file holds a
decoder weight: the parity checks prove the tied weight is loaded.
"""
from __future__ import annotations

import pytest
import torch

import family_models as fm
import model_factory as mf
from servers import Server, _engine

TOL = 1e-4


def _texts(model_dir: str) -> list[str]:
    return mf.mixed_prompts(mf.hf_tokenizer(model_dir), lengths=(3, 120, 17, 40))


def test_splade_config_architecture_matches_mlm_reference(shared_llm, splade_dir):
    llm = shared_llm(splade_dir)
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.pooler_config.pooling_type == "SPLADE"
    assert not cfg.cache_config.enable_prefix_caching
    for out in llm.embed(_texts(splade_dir), use_tqdm=False):
        ref = fm.splade_reference(splade_dir, out.prompt_token_ids)
        emb = torch.tensor(out.outputs.embedding)
        assert emb.shape == (mf.BERT_VOCAB,)
        assert mf.max_abs_diff(emb, ref) <= TOL
        assert (emb >= 0).all() and (emb == 0).any()  # relu-saturated: non-negative, sparse


def test_sparse_encoder_checkpoint_matches_sentence_transformers(shared_llm, splade_st_dir):
    from sentence_transformers import SparseEncoder
    llm = shared_llm(splade_st_dir)
    assert llm.llm_engine.model_config.architecture == "BertSpladeSparseEmbeddingModel"
    texts = _texts(splade_st_dir)
    st = SparseEncoder(splade_st_dir, device="cpu")
    ref = torch.stack([st.encode([t], convert_to_tensor=True)[0].to_dense() for t in texts])
    dense = llm.embed(texts, use_tqdm=False)
    sparse = llm.embed(texts, sparse=True, use_tqdm=False)
    for d, s, r in zip(dense, sparse, ref):
        assert mf.max_abs_diff(torch.tensor(d.outputs.embedding), r) <= TOL
        nz = torch.nonzero(r).flatten().tolist()
        assert sorted(s.outputs.embedding) == nz
        assert all(abs(s.outputs.embedding[i] - float(r[i])) <= TOL for i in nz)


def test_sparse_refused_for_dense_models(shared_llm, bert_embed_dir):
    with pytest.raises(ValueError, match="sparse=True needs a SPLADE model"):
        shared_llm(bert_embed_dir).embed(["a"], sparse=True, use_tqdm=False)


def test_sparse_embeddings_route(splade_dir):
    text = "the quick brown fox"
    ids = mf.hf_tokenizer(splade_dir)(text)["input_ids"]
    ref = fm.splade_reference(splade_dir, ids)
    engine = _engine(splade_dir)
    server = Server(engine)
    try:
        dense = server.post("/v1/embeddings", {"input": text})
        assert dense.status_code == 200, dense.text
        assert mf.max_abs_diff(dense.json()["data"][0]["embedding"], ref) <= TOL
        r = server.post("/v1/embeddings", {"input": [text], "sparse": True})
        assert r.status_code == 200, r.text
        weights = {int(k): v for k, v in r.json()["data"][0]["embedding"].items()}
        assert sorted(weights) == torch.nonzero(ref).flatten().tolist()
        assert all(abs(v - float(ref[k])) <= TOL for k, v in weights.items())
        bad = server.post("/v1/embeddings", {"input": text, "sparse": True,
                                             "encoding_format": "base64"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "encoding_format"
    finally:
        server.close()
        engine.shutdown()
