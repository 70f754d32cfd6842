"""Issue 25 item 4: BGE-M3 (`BgeM3EmbeddingModel` over an XLM-R checkpoint with
sparse_linear.pt and colbert_linear.pt beside it), each output against a hand computation
from transformers' hidden states and the two files."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import model_factory as mf
from vllm import LLM

TEXTS = ["what is BGE M3?", "BM25 is a bag of words retrieval function", "a b a b a"]
M3 = {"hf_overrides": {"architectures": ["BgeM3EmbeddingModel"]}, "max_num_seqs": 8,
      "num_gpu_blocks_override": 64}


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory) -> str:
    path = mf.make_roberta(tmp_path_factory.mktemp("m3") / "bge_m3", cls="XLMRobertaModel",
                           seed=mf.SEED + 50)
    mf.edit_config(path, bos_token_id=101, eos_token_id=102)  # the tokenizer's [CLS] [SEP]
    gen = torch.Generator().manual_seed(mf.SEED + 51)
    h = 64
    torch.save({"weight": torch.randn(1, h, generator=gen) * 0.3,
                "bias": torch.randn(1, generator=gen)}, path / "sparse_linear.pt")
    torch.save({"weight": torch.randn(h, h, generator=gen) * 0.2,
                "bias": torch.randn(h, generator=gen) * 0.1}, path / "colbert_linear.pt")
    return str(path)


def _linear(path: str, name: str, x: torch.Tensor) -> torch.Tensor:
    state = torch.load(f"{path}/{name}.pt", weights_only=True)
    return x @ state["weight"].T + state["bias"]


def test_three_outputs_match_hand_computation(m3_dir):
    dense = LLM(m3_dir, **M3)
    assert dense.llm_engine.model_config.pooling_tasks == ("embed", "token_embed",
                                                          "token_classify")
    sparse = LLM(m3_dir, pooler_config={"task": "token_classify"}, **M3)
    multi = LLM(m3_dir, pooler_config={"task": "token_embed"}, **M3)
    for text, emb, lex, col, lex_map in zip(
            TEXTS, dense.embed(TEXTS, use_tqdm=False),
            sparse.encode(TEXTS, pooling_task="token_classify", use_tqdm=False),
            multi.encode(TEXTS, pooling_task="token_embed", use_tqdm=False),
            sparse.encode(TEXTS, pooling_task="token_classify", sparse=True, use_tqdm=False)):
        ids = lex.prompt_token_ids
        assert ids[0] == 101 and ids[-1] == 102  # the config's BOS ... EOS
        hs = mf.hf_hidden_states(m3_dir, ids)
        assert mf.cosine(emb.outputs.embedding, hs[0]) > 0.99999
        want_lex = torch.relu(_linear(m3_dir, "sparse_linear", hs[1:-1])).squeeze(-1)
        assert lex.outputs.data.shape == (len(ids) - 2,)  # BOS and EOS dropped, 1-D
        assert mf.max_abs_diff(lex.outputs.data, want_lex) < 1e-4
        want_col = F.normalize(_linear(m3_dir, "colbert_linear", hs[1:]), dim=-1)
        assert col.outputs.data.shape == want_col.shape  # BOS dropped, EOS kept
        assert mf.max_abs_diff(col.outputs.data, want_col) < 1e-4
        best: dict[int, float] = {}
        for tid, w in zip(ids[1:-1], want_lex.tolist()):
            if w > 0:
                best[tid] = max(best.get(tid, 0.0), w)
        assert lex_map.outputs.data.keys() == best.keys()
        assert all(abs(lex_map.outputs.data[k] - v) < 1e-4 for k, v in best.items())
    # Scores: cosine of the dense vectors; MaxSim sum of the ColBERT vectors.
    e = [o.outputs.embedding for o in dense.embed(TEXTS[:2], use_tqdm=False)]
    assert dense.score(TEXTS[0], TEXTS[1], use_tqdm=False)[0].outputs.score == \
        pytest.approx(mf.cosine(e[0], e[1]), abs=1e-5)
    q, d = (o.outputs.data for o in multi.encode(TEXTS[:2], pooling_task="token_embed",
                                                 use_tqdm=False))
    assert multi.score(TEXTS[0], TEXTS[1], use_tqdm=False)[0].outputs.score == \
        pytest.approx(float((q @ d.T).max(dim=1).values.sum()), rel=1e-5)
    with pytest.raises(ValueError, match="BgeM3EmbeddingModel running the token_classify"):
        dense.encode(TEXTS[:1], pooling_task="embed", sparse=True, use_tqdm=False)


def test_missing_extra_file_is_a_clear_error(m3_dir, tmp_path):
    import shutil
    copy = tmp_path / "m3_copy"
    shutil.copytree(m3_dir, copy)
    (copy / "colbert_linear.pt").unlink()
    with pytest.raises(ValueError, match="colbert_linear.pt beside the weights"):
        LLM(str(copy), **M3)


def test_pooling_route_lexical_weights(m3_dir):
    from servers import Server, _engine
    engine = _engine(m3_dir, pooler_config={"task": "token_classify"}, **{
        k: v for k, v in M3.items() if k != "num_gpu_blocks_override"})
    server = Server(engine)
    try:
        r = server.post("/pooling", {"input": TEXTS[2]})
        assert r.status_code == 200, r.text
        weights = r.json()["data"][0]["data"]
        assert isinstance(weights, list) and isinstance(weights[0], float)
        s = server.post("/pooling", {"input": TEXTS[2], "sparse": True})
        assert s.status_code == 200, s.text
        as_map = s.json()["data"][0]["data"]
        ids = mf.hf_tokenizer(m3_dir)(TEXTS[2])["input_ids"]
        assert set(map(int, as_map)) <= set(ids[1:-1])
        assert max(as_map.values()) == pytest.approx(max(weights), rel=1e-6)
        assert server.post("/pooling", {"input": "x", "task": "embed"}).status_code == 400
    finally:
        server.close()
        engine.shutdown()
