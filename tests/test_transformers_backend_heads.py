"""Task heads on the Transformers backend: encoder classifiers through their transformers
task class's own head (scores and reranks as native cross-encoders), causal classifiers
and token classifiers through the engine's `score` head (cached = uncached, chunked =
whole), and sentence-transformers Dense modules after the backbone; each equal to
transformers / sentence-transformers on a tiny seeded checkpoint."""
from __future__ import annotations

import pathlib

import pytest
import torch

import model_factory as mf
from vllm import LLM

ATOL = 1e-4
QUERY = "what is the capital city of France"
DOCS = ["Paris", "the quick brown fox jumps over the lazy dog " * 3,
        "Berlin is a city; Paris is the capital of France because of its long history"]
_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("transformers_heads")


def _build(path: pathlib.Path, config_cls: str, model_cls: str, seed: int, **config):
    import transformers
    cfg = getattr(transformers, config_cls)(**config)
    torch.manual_seed(mf.SEED + seed)
    model = getattr(transformers, model_cls)(cfg)
    mf._perturb(model)
    mf._save(model, path)
    return cfg


def _encoder(root, name: str, config_cls: str, model_cls: str, seed: int,
             token_types: bool = False, **config) -> str:
    """A tiny encoder with MiniLM's BERT tokenizer (segment ids only where the family
    takes them)."""
    path = mf._fresh(root / name)
    cfg = _build(path, config_cls, model_cls, seed, vocab_size=mf.BERT_VOCAB, **config)
    names = None if token_types else ["input_ids", "attention_mask"]
    mf.save_bert_tokenizer(path, model_input_names=names)
    mf.edit_config(path, hidden_size=cfg.hidden_size)  # DistilBERT's is an alias of `dim`
    return str(path)


def _decoder(root, name: str, config_cls: str, model_cls: str, seed: int, **config) -> str:
    """A tiny causal classifier with the BPE tokenizer (eos = pad)."""
    path = mf._fresh(root / name)
    eos = mf.bpe_token_id(mf.BPE_EOS)
    _build(path, config_cls, model_cls, seed, vocab_size=mf.BPE_VOCAB, bos_token_id=eos,
           eos_token_id=eos, pad_token_id=eos, tie_word_embeddings=False, **config)
    mf.save_bpe_tokenizer(path)
    return str(path)


ENCODERS = {
    "electra": ("ElectraConfig", "ElectraForSequenceClassification", True,
                dict(_SMALL, embedding_size=32, num_labels=1, type_vocab_size=2,
                     max_position_embeddings=256)),
    "camembert": ("CamembertConfig", "CamembertForSequenceClassification", False,
                  dict(_SMALL, num_labels=3, pad_token_id=1, max_position_embeddings=258,
                       type_vocab_size=1)),
    "distilbert": ("DistilBertConfig", "DistilBertForSequenceClassification", False,
                   dict(dim=64, hidden_dim=128, n_layers=2, n_heads=4, num_labels=1,
                        max_position_embeddings=256)),
    "mpnet": ("MPNetConfig", "MPNetForSequenceClassification", False,
              dict(_SMALL, num_labels=2, max_position_embeddings=258)),
}


@pytest.fixture(scope="module")
def encoder_dirs(root) -> dict[str, str]:
    return {name: _encoder(root, name, cfg, cls, 20 + i, token_types, **config)
            for i, (name, (cfg, cls, token_types, config)) in enumerate(ENCODERS.items())}


def _prompts(path: str, lengths=(3, 70, 17, 41)) -> list[str]:
    return mf.mixed_prompts(mf.hf_tokenizer(path), lengths)


def _check_probs(outs, path: str) -> None:
    for out in outs:
        ref = mf.probs_from_logits(mf.hf_seqcls_logits(path, out.prompt_token_ids))
        assert mf.max_abs_diff(torch.tensor(out.outputs.probs), ref) <= ATOL


@pytest.mark.parametrize("name", list(ENCODERS))
def test_encoder_classifier_equals_transformers(name, encoder_dirs, vllm_log):
    """The task class's own head over the engine's CLS row: classify equals transformers'
    *ForSequenceClassification through sigmoid (one label) / softmax; one-label models
    score pairs (segment ids included where the family takes them)."""
    path = encoder_dirs[name]
    llm = LLM(path, dtype="float32", model_impl="transformers")
    mc = llm.llm_engine.vllm_config.model_config
    assert mc.impl == "transformers" and mc.pooler_config.pooling_type == "CLS"
    assert not llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    _check_probs(llm.classify(_prompts(path), use_tqdm=False), path)
    if mc.num_labels != 1:
        return
    tok = mf.hf_tokenizer(path)
    for doc, out in zip(DOCS, llm.score(QUERY, DOCS, use_tqdm=False)):
        enc = tok(QUERY, doc)
        logits = mf.hf_seqcls_logits(path, enc["input_ids"], enc.get("token_type_ids"))
        assert abs(out.outputs.score - torch.sigmoid(logits).item()) <= ATOL
    if ENCODERS[name][2]:
        assert 1 in tok(QUERY, DOCS[2])["token_type_ids"]


def test_backend_cross_encoder_serves_score_and_rerank(encoder_dirs):
    """/score and /rerank on an Electra cross-encoder served by the backend equal
    transformers' sigmoid(logit) of each (query, document) pair."""
    from servers import Server, _engine
    path = encoder_dirs["electra"]
    tok = mf.hf_tokenizer(path)
    refs = []
    for doc in DOCS:
        enc = tok(QUERY, doc)
        refs.append(torch.sigmoid(mf.hf_seqcls_logits(path, enc["input_ids"],
                                                      enc["token_type_ids"])).item())
    engine = _engine(path, dtype="float32")
    server = Server(engine, served_model_name=["electra"])
    try:
        score = server.post("/score", {"model": "electra", "text_1": QUERY, "text_2": DOCS})
        assert score.status_code == 200, score.text
        for item in score.json()["data"]:
            assert abs(item["score"] - refs[item["index"]]) <= ATOL
        rerank = server.post("/rerank", {"model": "electra", "query": QUERY,
                                         "documents": DOCS})
        assert rerank.status_code == 200, rerank.text
        results = rerank.json()["results"]
        assert [r["relevance_score"] for r in results] == sorted(
            (r["relevance_score"] for r in results), reverse=True)
        for r in results:
            assert abs(r["relevance_score"] - refs[r["index"]]) <= ATOL
    finally:
        server.close()
        engine.shutdown()


def test_encoder_classifier_serves_its_encoder_for_embeddings(encoder_dirs):
    path = encoder_dirs["electra"]
    llm = LLM(path, dtype="float32", convert="embed")
    for out in llm.embed(_prompts(path)[:2], use_tqdm=False):
        ref = mf.hf_embedding(path, out.prompt_token_ids, "CLS", normalize=True)
        assert mf.cosine(out.outputs.embedding, ref) >= 0.9999


def test_encoder_token_classifier_equals_transformers(root):
    """ElectraForTokenClassification: its own head on every token (token_classify)."""
    import transformers
    cfg, _, _, config = ENCODERS["electra"]
    path = _encoder(root, "electra_tok", cfg, "ElectraForTokenClassification", 60, True,
                    **dict(config, num_labels=4))
    llm = LLM(path, dtype="float32")
    assert llm.llm_engine.vllm_config.model_config.pooler_config.pooling_type == "ALL"
    ref_model = transformers.ElectraForTokenClassification.from_pretrained(
        path, dtype=torch.float32).eval()
    for out in llm.encode(_prompts(path), pooling_task="token_classify", use_tqdm=False):
        with torch.inference_mode():
            logits = ref_model(input_ids=torch.tensor([out.prompt_token_ids])).logits[0]
        assert mf.max_abs_diff(out.outputs.data, torch.softmax(logits, -1)) <= ATOL


def test_encoder_without_a_head_is_not_a_classifier(encoder_dirs, root):
    path = mf.copy_checkpoint(encoder_dirs["camembert"], root / "camembert_model",
                              architectures=["CamembertModel"])
    with pytest.raises(ValueError, match="has no 'classify' head"):
        LLM(str(path), convert="classify")


def test_head_reading_more_than_its_row_is_refused(encoder_dirs, monkeypatch):
    """A head whose output depends on tokens the engine does not hand it is refused at
    load (here: a patched Electra head that reads the last token, not the first)."""
    from transformers.models.electra import modeling_electra as me
    original = me.ElectraClassificationHead.forward
    monkeypatch.setattr(me.ElectraClassificationHead, "forward",
                        lambda self, features, **kw: original(self, features[:, -1:], **kw))
    with pytest.raises(ValueError, match="reads more than the first token"):
        LLM(encoder_dirs["electra"], dtype="float32")


# ------------------------------------------------------------------ causal heads

_DEC = dict(_SMALL, num_key_value_heads=2, max_position_embeddings=512)
DECODERS = {
    "gpt2": ("GPT2Config", "GPT2ForSequenceClassification",
             dict(n_embd=64, n_layer=2, n_head=4, n_positions=512, num_labels=3)),
    "gemma": ("GemmaConfig", "GemmaForSequenceClassification",
              dict(_DEC, head_dim=16, num_labels=1)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3TextForSequenceClassification",
                    dict(_DEC, head_dim=16, num_labels=2, sliding_window=16,
                         layer_types=["sliding_attention", "full_attention"])),
    "smollm3": ("SmolLM3Config", "SmolLM3ForSequenceClassification",
                dict(_DEC, num_labels=2)),
    "exaone4": ("Exaone4Config", "Exaone4ForSequenceClassification",
                dict(_DEC, num_labels=1)),
}


@pytest.fixture(scope="module")
def decoder_dirs(root) -> dict[str, str]:
    return {name: _decoder(root, name, cfg, cls, 30 + i, **config)
            for i, (name, (cfg, cls, config)) in enumerate(DECODERS.items())}


@pytest.mark.parametrize("name", list(DECODERS))
def test_causal_classifier_cached_and_chunked_equal_transformers(name, decoder_dirs):
    """LAST pooling on a causal backbone: prefix caching and chunked prefill on by
    default; the chunked run, the cached rerun and the whole run all equal transformers
    (GPT-2 pools the last non-pad token: unpadded, the last token)."""
    path = decoder_dirs[name]
    llm = LLM(path, dtype="float32", model_impl="transformers", max_num_batched_tokens=32,
              block_size=16)
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.impl == "transformers"
    assert cfg.cache_config.enable_prefix_caching and cfg.scheduler_config.enable_chunked_prefill
    shared = mf.text_of_length(mf.hf_tokenizer(path), 40, seed=3)
    prompts = [shared + " " + p for p in _prompts(path)]
    first = llm.classify(prompts, use_tqdm=False)
    second = llm.classify(prompts, use_tqdm=False)
    assert all(o.num_cached_tokens > 0 for o in second)
    assert llm.llm_engine.stats.num_split_requests > 0
    _check_probs(first, path)
    _check_probs(second, path)


TOKEN_CLASSIFIERS = {"qwen3": ("Qwen3Config", "Qwen3ForTokenClassification",
                               dict(_DEC, head_dim=16, num_labels=3)),
                     "llama": ("LlamaConfig", "LlamaForTokenClassification",
                               dict(_DEC, num_labels=4))}


@pytest.mark.parametrize("name", list(TOKEN_CLASSIFIERS))
def test_causal_token_classifier_equals_transformers(name, root):
    """Native families through model_impl='transformers': token_classify gives one label
    distribution per token; asked-for caching and chunking stay exact (ALL pooling)."""
    import transformers
    cfg, cls, config = TOKEN_CLASSIFIERS[name]
    path = _decoder(root, f"tok_{name}", cfg, cls, 40, **config)
    llm = LLM(path, dtype="float32", model_impl="transformers", enable_prefix_caching=True,
              enable_chunked_prefill=True, max_num_batched_tokens=32, block_size=16)
    assert llm.llm_engine.vllm_config.model_config.impl == "transformers"
    ref_model = getattr(transformers, cls).from_pretrained(path, dtype=torch.float32).eval()
    shared = mf.text_of_length(mf.hf_tokenizer(path), 40, seed=5)
    prompts = [shared + " " + p for p in _prompts(path)]
    first = llm.encode(prompts, pooling_task="token_classify", use_tqdm=False)
    second = llm.encode(prompts, pooling_task="token_classify", use_tqdm=False)
    assert all(o.num_cached_tokens > 0 for o in second)
    for out in first + second:
        with torch.inference_mode():
            logits = ref_model(input_ids=torch.tensor([out.prompt_token_ids])).logits[0]
        ref = torch.softmax(logits.float(), dim=-1)
        assert mf.max_abs_diff(torch.as_tensor(out.outputs.data), ref) <= ATOL


def test_family_classifier_transformers_lacks_takes_the_score_head(root):
    """GraniteForSequenceClassification: transformers has Granite but no such class; as
    upstream's as_seq_cls_model, the backend serves Granite's base model with the engine's
    `score` head on the last token (Granite's multipliers included), cached and chunked."""
    import transformers
    from safetensors.torch import load_file, save_file
    path = mf._fresh(root / "granite_cls")
    eos = mf.bpe_token_id(mf.BPE_EOS)
    _build(path, "GraniteConfig", "GraniteForCausalLM", 60, vocab_size=mf.BPE_VOCAB,
           bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, tie_word_embeddings=False,
           embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2,
           logits_scaling=4.0, **_DEC)
    mf.save_bpe_tokenizer(path)
    weights = {k: v for k, v in load_file(str(path / "model.safetensors")).items()
               if not k.startswith("lm_head.")}
    weights["score.weight"] = torch.randn(2, _DEC["hidden_size"],
                                          generator=torch.Generator().manual_seed(7)) / 8
    save_file(weights, str(path / "model.safetensors"))
    mf.edit_config(path, architectures=["GraniteForSequenceClassification"], num_labels=2)
    llm = LLM(str(path), dtype="float32", max_num_batched_tokens=32, block_size=16)
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.impl == "transformers"
    assert cfg.cache_config.enable_prefix_caching and cfg.scheduler_config.enable_chunked_prefill
    base = transformers.GraniteModel.from_pretrained(str(path), dtype=torch.float32).eval()
    shared = mf.text_of_length(mf.hf_tokenizer(str(path)), 40, seed=3)
    prompts = [shared + " " + p for p in _prompts(str(path))]
    first = llm.classify(prompts, use_tqdm=False)
    second = llm.classify(prompts, use_tqdm=False)
    assert all(o.num_cached_tokens > 0 for o in second)
    for out in first + second:
        with torch.inference_mode():
            hidden = base(input_ids=torch.tensor([out.prompt_token_ids])).last_hidden_state
        ref = torch.softmax(hidden[0, -1] @ weights["score.weight"].t(), dim=-1)
        assert mf.max_abs_diff(torch.as_tensor(out.outputs.probs), ref) <= ATOL


def test_vision_language_classifier_on_text_equals_transformers(root):
    """Gemma3ForSequenceClassification over a Gemma3Config (text + vision towers): not the
    native text-only Gemma 3 (its config is nested), but the backend's Gemma3Model on text
    prompts with the engine's score head; causal, so cached and chunked, equal to
    transformers' own class."""
    import transformers
    path = mf._fresh(root / "gemma3_vl_cls")
    eos = mf.bpe_token_id(mf.BPE_EOS)
    text = dict(_DEC, head_dim=16, vocab_size=mf.BPE_VOCAB, sliding_window=16,
                layer_types=["sliding_attention", "full_attention"], bos_token_id=eos,
                eos_token_id=eos, pad_token_id=eos)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=32, patch_size=8)
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision,
                                    mm_tokens_per_image=4, num_labels=2, bos_token_id=eos,
                                    eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(mf.SEED + 61)
    model = transformers.Gemma3ForSequenceClassification(cfg)
    mf._perturb(model)
    mf._save(model, path)
    mf.save_bpe_tokenizer(path)
    llm = LLM(str(path), dtype="float32", max_num_batched_tokens=32, block_size=16)
    vc = llm.llm_engine.vllm_config
    assert vc.model_config.impl == "transformers"
    assert vc.cache_config.enable_prefix_caching and vc.scheduler_config.enable_chunked_prefill
    shared = mf.text_of_length(mf.hf_tokenizer(str(path)), 40, seed=3)
    prompts = [shared + " " + p for p in _prompts(str(path))]
    first = llm.classify(prompts, use_tqdm=False)
    second = llm.classify(prompts, use_tqdm=False)
    assert all(o.num_cached_tokens > 0 for o in second)
    model.eval()
    for out in first + second:
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([out.prompt_token_ids])).logits[0]
        ref = torch.softmax(logits.float(), dim=-1)
        assert mf.max_abs_diff(torch.as_tensor(out.outputs.probs), ref) <= ATOL


# ------------------------------------------------------------------ sentence-transformers Dense

def _st_encoder(root, name: str, config_cls: str, model_cls: str, **st) -> str:
    path = _encoder(root, name, config_cls, model_cls, 50, **ST_ENCODERS[name])
    mf.write_st_files(path, pooling="mean", max_seq_length=128, **st)
    return path


ST_ENCODERS = {
    # sentence-t5's layout: mean pooling, a bias-free Identity Dense, Normalize
    "t5": dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
               relative_attention_num_buckets=8, dropout_rate=0.0, feed_forward_proj="relu",
               pad_token_id=0),
    "distilbert_dense": dict(dim=64, hidden_dim=128, n_layers=2, n_heads=4,
                             max_position_embeddings=256),
    # EuroBERT: a Llama-style bidirectional encoder (rotary, RMSNorm, SwiGLU), mean pooling
    "eurobert": dict(_SMALL, num_key_value_heads=4, max_position_embeddings=256,
                     pad_token_id=0, bos_token_id=101, eos_token_id=102, mask_token_id=103),
}


@pytest.fixture(scope="module")
def t5_dir(root) -> str:
    return _st_encoder(root, "t5", "T5Config", "T5EncoderModel", normalize=True,
                       dense=(64, 48), dense_activation="Identity", dense_bias=False)


@pytest.fixture(scope="module")
def distilbert_dense_dir(root) -> str:
    return _st_encoder(root, "distilbert_dense", "DistilBertConfig", "DistilBertModel",
                       dense=(64, 32))


@pytest.fixture(scope="module")
def eurobert_dir(root) -> str:
    return _st_encoder(root, "eurobert", "EuroBertConfig", "EuroBertModel", normalize=True)


@pytest.mark.parametrize("name,dim,whole", [("t5_dir", 48, True),
                                            ("distilbert_dense_dir", 32, False),
                                            ("eurobert_dir", 64, False)])
def test_st_dense_modules_equal_sentence_transformers(name, dim, whole, request):
    """Pooling, Dense (Identity without bias for sentence-t5, Tanh for DistilBERT) and
    Normalize after the backend's backbone, equal to sentence-transformers' encode."""
    path = request.getfixturevalue(name)
    llm = LLM(path, dtype="float32")
    cfg = llm.llm_engine.vllm_config
    mc = cfg.model_config
    assert mc.impl == "transformers" and mc.whole_sequences is whole
    assert mc.pooler_config.pooling_type == "MEAN"
    # bidirectional encoders (EuroBERT's Llama-style layers too): no caching, no chunking
    assert not cfg.cache_config.enable_prefix_caching
    assert not cfg.scheduler_config.enable_chunked_prefill
    prompts = _prompts(path)
    ref = mf.st_encode(path, prompts)
    for out, r in zip(llm.embed(prompts, use_tqdm=False), ref):
        got = torch.tensor(out.outputs.embedding)
        assert got.shape == (dim,)
        assert mf.cosine(got, r) >= 0.9999
        assert abs(got.norm().item() / r.norm().item() - 1) <= 1e-3


def test_whole_sequence_step_runs_as_one_padded_batch(encoder_dirs, monkeypatch):
    """MPNet (attention that cannot be routed) runs a step's requests as one right-padded
    batch with an attention mask, equal to each request run alone."""
    path = encoder_dirs["mpnet"]
    llm = LLM(path, dtype="float32", model_impl="transformers")
    hf = llm.llm_engine.runner.model.model.hf
    shapes = []
    original = hf.forward
    monkeypatch.setattr(hf, "forward", lambda *a, **kw: shapes.append(
        (kw["input_ids"].shape, int(kw["attention_mask"].sum()))) or original(*a, **kw))
    prompts = _prompts(path)
    outs = llm.classify(prompts, use_tqdm=False)
    lengths = sorted(len(o.prompt_token_ids) for o in outs)
    assert shapes == [((len(prompts), lengths[-1]), sum(lengths))]
    _check_probs(outs, path)
