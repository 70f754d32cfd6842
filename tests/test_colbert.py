"""ColBERT multi-vector models: per-token L2-normalised vectors (`token_embed`, special
tokens included) equal a Transformers reference; `score` / `/score` / `/rerank` are MaxSim.

Two layouts: Stanford's HF_ColBERT (BERT + `linear`, its size from the weight) and a
PyLate-style ModernBERT checkpoint served as ColBERTModernBertModel through hf_overrides,
whose projection is the sentence-transformers 1_Dense module.
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import family_models as fm
import model_factory as mf
from servers import Server, _engine
from vllm import LLM

COS_MIN = 0.9999
TOL = 1e-4
MODERN = {"hf_overrides": {"architectures": ["ColBERTModernBertModel"]}}


def _weight(model_dir: str, fixture: str) -> torch.Tensor:
    if fixture == "hf_colbert_dir":
        return load_file(f"{model_dir}/model.safetensors")["linear.weight"]
    return load_file(f"{model_dir}/1_Dense/model.safetensors")["linear.weight"]


def _llm(shared_llm, fixture: str, model_dir: str):
    return shared_llm(model_dir, **(MODERN if fixture == "modern_colbert_dir" else {}))


def _maxsim(q: torch.Tensor, d: torch.Tensor) -> float:
    return float(sum(max(float(qt @ dt) for dt in d) for qt in q))  # the definition, slowly


@pytest.mark.parametrize("fixture,dim", [("hf_colbert_dir", 32), ("modern_colbert_dir", 24)])
def test_token_embed_matches_reference(request, shared_llm, fixture, dim):
    model_dir = request.getfixturevalue(fixture)
    llm = _llm(shared_llm, fixture, model_dir)
    assert llm.llm_engine.model_config.supported_tasks == ("encode", "token_embed", "score")
    texts = mf.mixed_prompts(mf.hf_tokenizer(model_dir), lengths=(3, 90, 17))
    weight = _weight(model_dir, fixture)
    for out in llm.encode(texts, pooling_task="token_embed", use_tqdm=False):
        ids = out.prompt_token_ids
        assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP] are kept
        ref = fm.colbert_reference(model_dir, ids, weight)
        got = out.outputs.data
        assert got.shape == (len(ids), dim)
        assert torch.allclose(got.norm(dim=-1), torch.ones(len(ids)), atol=1e-5)
        assert min(mf.cosine(g, r) for g, r in zip(got, ref)) >= COS_MIN


def test_score_is_maxsim(shared_llm, hf_colbert_dir):
    llm = shared_llm(hf_colbert_dir)
    query, docs = "what is a river", ["a river is water", "the cat sat", "river river"]
    outs = llm.score(query, docs, use_tqdm=False)
    vecs = {t: o.outputs.data for t, o in zip(
        [query] + docs, llm.encode([query] + docs, pooling_task="token_embed",
                                   use_tqdm=False))}
    for d, out in zip(docs, outs):
        assert abs(out.outputs.score - _maxsim(vecs[query], vecs[d])) <= TOL


def test_projection_size_from_config_is_checked(hf_colbert_dir):
    with pytest.raises(ValueError, match="dim 16"):
        LLM(hf_colbert_dir, hf_overrides={"dim": 16})


def test_pooling_token_embed_and_rerank_routes(modern_colbert_dir):
    engine = _engine(modern_colbert_dir, **MODERN)
    server = Server(engine)
    weight = _weight(modern_colbert_dir, "modern_colbert_dir")
    query, docs = "what is a river", ["a river is water", "the cat sat on the mat"]
    tok = mf.hf_tokenizer(modern_colbert_dir)
    vecs = [fm.colbert_reference(modern_colbert_dir, tok(t)["input_ids"], weight)
            for t in [query] + docs]
    try:
        r = server.post("/pooling", {"input": query, "task": "token_embed"})
        assert r.status_code == 200, r.text
        got = torch.tensor(r.json()["data"][0]["data"])
        assert got.shape == vecs[0].shape
        assert min(mf.cosine(g, v) for g, v in zip(got, vecs[0])) >= COS_MIN
        r = server.post("/rerank", {"query": query, "documents": docs})
        assert r.status_code == 200, r.text
        expected = [_maxsim(vecs[0], v) for v in vecs[1:]]
        by_index = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        assert all(abs(by_index[i] - e) <= TOL for i, e in enumerate(expected))
        bad = server.post("/pooling", {"input": query, "task": "classify"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "task"
    finally:
        server.close()
        engine.shutdown()


def test_embed_on_a_token_embed_engine_returns_its_matrices(shared_llm, hf_colbert_dir):
    """As upstream 0.33: LLM.embed on an engine running token_embed answers each prompt's
    matrix of token vectors (PoolingRequestOutput), the same as encode(token_embed)."""
    from vllm.outputs import PoolingRequestOutput
    llm = _llm(shared_llm, "hf_colbert_dir", hf_colbert_dir)
    texts = ["what is a colbert model", "late interaction"]
    got = llm.embed(texts, use_tqdm=False)
    want = llm.encode(texts, pooling_task="token_embed", use_tqdm=False)
    assert all(type(o) is PoolingRequestOutput for o in got)
    for g, w in zip(got, want):
        assert g.outputs.data.dim() == 2 and torch.equal(g.outputs.data, w.outputs.data)
