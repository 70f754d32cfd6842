"""Issue 25 items 1-3: one pooling task per engine (upstream 0.32's choice), token
classification (NER) on encoders and causal LMs, and token_embed on every embedding model,
offline and on /pooling, each checked against transformers one prompt at a time."""
from __future__ import annotations

import pytest
import torch

import family_models as fam
import model_factory as mf
from vllm import LLM
from vllm.config.pooler import PoolerConfig

TEXTS = ["John Smith lives in New York.", "a b", "the quick brown fox jumps over the dog"]
NER_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


def _token_logits(path: str, ids: list[int]) -> torch.Tensor:
    import transformers
    model = transformers.AutoModelForTokenClassification.from_pretrained(
        path, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def _llm(path: str, **kw) -> LLM:
    return LLM(path, max_num_seqs=8, num_gpu_blocks_override=64, **kw)


NER_BUILDERS = {
    "bert": lambda p: mf.make_bert(p, cls="BertForTokenClassification", num_labels=5,
                                   id2label=NER_LABELS, seed=mf.SEED + 40),
    "xlmr": lambda p: mf.make_roberta(p, cls="XLMRobertaForTokenClassification",
                                      num_labels=5, seed=mf.SEED + 41),
    "modernbert": lambda p: fam.make_modernbert(p, cls="ModernBertForTokenClassification",
                                                num_labels=5, seed=mf.SEED + 42),
    "qwen3": lambda p: mf.make_decoder(p, "qwen3", head="ForTokenClassification",
                                       num_labels=3, seed=mf.SEED + 43),
}


@pytest.mark.parametrize("family", sorted(NER_BUILDERS))
def test_token_classify_matches_transformers(family, tmp_path):
    path = str(NER_BUILDERS[family](tmp_path / family))
    llm = _llm(path)
    mc = llm.llm_engine.model_config
    assert mc.pooling_task == "token_classify" and mc.pooling_tasks == ("token_classify",)
    assert "classify" not in mc.supported_tasks and "score" not in mc.supported_tasks
    outs = llm.encode(TEXTS, pooling_task="token_classify", use_tqdm=False)
    for out in outs:
        ref = torch.softmax(_token_logits(path, out.prompt_token_ids), dim=-1)
        assert out.outputs.data.shape == ref.shape  # [n_tokens, num_labels], specials kept
        assert mf.max_abs_diff(out.outputs.data, ref) < 1e-4
    # The default of LLM.encode on a token classifier is its task; raw logits on request.
    default = llm.encode(TEXTS[:1], use_tqdm=False)[0].outputs.data
    assert mf.max_abs_diff(default, outs[0].outputs.data) < 1e-5
    from vllm import PoolingParams
    raw = llm.encode(TEXTS[:1], PoolingParams(activation=False),
                     pooling_task="token_classify", use_tqdm=False)[0]
    assert mf.max_abs_diff(raw.outputs.data, _token_logits(path, raw.prompt_token_ids)) < 1e-4
    with pytest.raises(ValueError, match="does not support the 'classify' task"):
        llm.classify(TEXTS[:1], use_tqdm=False)


def test_qwen3_token_classifier_uses_score_bias(tmp_path):
    path = str(NER_BUILDERS["qwen3"](tmp_path / "q3"))
    from safetensors import safe_open
    with safe_open(f"{path}/model.safetensors", framework="pt") as f:
        assert "score.bias" in f.keys() and f.get_tensor("score.bias").abs().sum() > 0


def test_seq_classifier_served_for_token_classify(bert_cls3_dir):
    """A sequence classifier started with task token_classify: its classifier on every
    token (BERT's pooler dense belongs to the CLS summary only, as upstream)."""
    llm = _llm(bert_cls3_dir, pooler_config={"task": "token_classify"})
    assert llm.llm_engine.model_config.supported_tasks == ("encode", "token_classify")
    out = llm.encode(TEXTS[:1], pooling_task="token_classify", use_tqdm=False)[0]
    import transformers
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        bert_cls3_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        hidden = model.bert(input_ids=torch.tensor([out.prompt_token_ids])).last_hidden_state
        ref = torch.softmax(model.classifier(hidden[0]), dim=-1)
    assert mf.max_abs_diff(out.outputs.data, ref) < 1e-4
    with pytest.raises(ValueError, match=r'PoolerConfig\(task="classify"\)'):
        llm.classify(TEXTS[:1], use_tqdm=False)


@pytest.mark.parametrize("name,pooling", [("bert_st_dense_dir", "MEAN"),
                                          ("qwen3_embed_dir", "LAST")])
def test_token_embed_on_embedding_models(name, pooling, request):
    path = request.getfixturevalue(name)
    llm = _llm(path, pooler_config=PoolerConfig(task="token_embed"))
    mc = llm.llm_engine.model_config
    assert mc.pooling_task == "token_embed" and mc.pooling_tasks == ("embed", "token_embed")
    # Every token is read: the gate keeps caching and chunking off even for LAST + causal.
    assert not llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    outs = llm.encode(TEXTS, pooling_task="token_embed", use_tqdm=False)
    st = mc.st_config
    for out in outs:
        hs = mf.hf_hidden_states(path, out.prompt_token_ids)
        ref = hs
        if st is not None and st.dense:
            ref = _st_dense(path, hs)
        ref = torch.nn.functional.normalize(ref, dim=-1)
        assert out.outputs.data.shape == ref.shape
        assert min(torch.nn.functional.cosine_similarity(out.outputs.data, ref)) > 0.9999
        assert mf.max_abs_diff(out.outputs.data.norm(dim=-1), torch.ones(len(ref))) < 1e-5
    # LLM.embed on a token_embed engine answers its matrices, as upstream 0.33 (issue 36)
    matrices = llm.embed(TEXTS[:1], use_tqdm=False)
    assert torch.equal(matrices[0].outputs.data, outs[0].outputs.data)
    # Scoring under token_embed is MaxSim of the token vectors, as upstream.
    q, d = outs[0].outputs.data, outs[2].outputs.data
    score = llm.score(TEXTS[0], TEXTS[2], use_tqdm=False)[0].outputs.score
    assert score == pytest.approx(float((q @ d.T).max(dim=1).values.sum()), rel=1e-5)


def _st_dense(path: str, hs: torch.Tensor) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(path, device="cpu")
    dense = st[2]
    with torch.inference_mode():
        return dense({"sentence_embedding": hs})["sentence_embedding"]


def test_engine_task_selection_and_errors(bert_embed_dir, bert_cls3_dir):
    llm = _llm(bert_embed_dir)
    mc = llm.llm_engine.model_config
    assert (mc.pooling_task, mc.supported_tasks) == ("embed", ("encode", "embed", "score"))
    with pytest.raises(ValueError, match=r'PoolerConfig\(task="token_embed"\)'):
        llm.encode(TEXTS[:1], pooling_task="token_embed", use_tqdm=False)
    with pytest.raises(ValueError, match="does not support the 'token_classify' task"):
        llm.encode(TEXTS[:1], pooling_task="token_classify", use_tqdm=False)
    with pytest.raises(ValueError, match=r"Unsupported task: 'classify' Supported tasks"):
        _llm(bert_embed_dir, pooler_config={"task": "classify"})
    with pytest.raises(ValueError, match="`encode` task was removed"):
        PoolerConfig(task="encode")
    # The engine keeps serving after the refusals.
    assert len(llm.embed(TEXTS, use_tqdm=False)) == 3


def test_pooling_route_token_tasks(tmp_path, bert_embed_dir):
    """/pooling on a NER model answers one probability list per token; its task field
    follows upstream's rules; /classify and /score are not served (404)."""
    from servers import Server, _engine
    path = str(NER_BUILDERS["bert"](tmp_path / "ner"))
    engine = _engine(path)
    server = Server(engine)
    try:
        r = server.post("/pooling", {"input": TEXTS[0]})
        assert r.status_code == 200, r.text
        got = torch.tensor(r.json()["data"][0]["data"])
        ids = mf.hf_tokenizer(path)(TEXTS[0])["input_ids"]
        assert mf.max_abs_diff(got, torch.softmax(_token_logits(path, ids), -1)) < 1e-4
        named = server.post("/pooling", {"input": TEXTS[0], "task": "token_classify"})
        assert named.json()["data"] == r.json()["data"]
        bad = server.post("/pooling", {"input": "x", "task": "embed"})
        assert bad.status_code == 400 and bad.json()["error"]["message"] == \
            "Unsupported task: 'embed' Supported tasks: ('token_classify',)"
        plugin = server.post("/pooling", {"input": "x", "task": "plugin"})
        assert plugin.status_code == 400 and "No IOProcessor plugin installed" in \
            plugin.json()["error"]["message"]
        for route in ("/classify", "/score", "/rerank", "/v1/embeddings"):
            assert server.post(route, {"input": "x"}).status_code == 404, route
    finally:
        server.close()
        engine.shutdown()
    engine = _engine(bert_embed_dir)  # an embedding engine: token_embed needs a restart
    server = Server(engine)
    try:
        r = server.post("/pooling", {"input": "x", "task": "token_embed"})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == \
            "Try switching the model's pooling_task via --pooler-config.task token_embed."
    finally:
        server.close()
        engine.shutdown()
    engine = _engine(bert_embed_dir, pooler_config={"task": "token_embed"})
    server = Server(engine)
    try:
        r = server.post("/pooling", {"input": TEXTS[0]})  # the engine's token task
        assert r.status_code == 200, r.text
        got = torch.tensor(r.json()["data"][0]["data"])
        ids = mf.hf_tokenizer(bert_embed_dir)(TEXTS[0])["input_ids"]
        ref = torch.nn.functional.normalize(mf.hf_hidden_states(bert_embed_dir, ids), dim=-1)
        assert got.shape == ref.shape and mf.max_abs_diff(got, ref) < 1e-4
        emb = server.post("/v1/embeddings", {"input": TEXTS[0]})  # the matrix, as upstream
        assert emb.status_code == 200 and torch.equal(
            torch.tensor(emb.json()["data"][0]["embedding"]), got)
        rr = server.post("/rerank", {"query": "a b", "documents": ["a", "b c"]})
        assert rr.status_code == 200, rr.text  # MaxSim, as ColBERT
    finally:
        server.close()
        engine.shutdown()


@pytest.mark.parametrize("task", ["token_classify", "token_embed"])
def test_token_tasks_exact_with_caching_and_chunking_on_causal_models(task, tmp_path,
                                                                       qwen3_embed_dir):
    """Asked for, prefix caching and chunked prefill run token tasks on a causal model
    exactly (as ALL pooling: cached blocks carry their rows); a repeat reports hits."""
    path = str(NER_BUILDERS["qwen3"](tmp_path / "q3")) if task == "token_classify" \
        else qwen3_embed_dir
    kw = {"pooler_config": {"task": task}} if task == "token_embed" else {}
    base = " ".join(f"w{i % 5}" for i in range(50))
    texts = [base + " tail one", base + " another tail here", base + " x"]
    fast = _llm(path, enable_prefix_caching=True, enable_chunked_prefill=True,
                max_num_batched_tokens=37, **kw)
    plain = _llm(path, enable_prefix_caching=False, enable_chunked_prefill=False, **kw)
    want = plain.encode(texts, pooling_task=task, use_tqdm=False)
    for repeat in range(2):
        got = fast.encode(texts, pooling_task=task, use_tqdm=False)
        for g, w in zip(got, want):
            assert mf.max_abs_diff(g.outputs.data, w.outputs.data) < 1e-5
        assert (min(o.num_cached_tokens for o in got) > 0) == (repeat == 1)
