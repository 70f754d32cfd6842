"""How the pooler config is resolved: user override > sentence-transformers files > class default.

The resolved value is read where vLLM users read it:
``llm.llm_engine.vllm_config.model_config.pooler_config``.
"""
from __future__ import annotations

import json
import pathlib

import pytest
import torch

import model_factory as mf
from vllm import LLM


def _pooler(llm):
    return llm.llm_engine.vllm_config.model_config.pooler_config


def _model_config(llm):
    return llm.llm_engine.vllm_config.model_config


SENTENCES = ["Hello world", "the quick brown fox jumps over the lazy dog " * 8,
             "a short one", "Paris is the capital of France; Berlin is the capital of Germany"]


# ------------------------------------------------------------------ class defaults

@pytest.mark.parametrize("fixture,expected", [
    ("bert_embed_dir", "CLS"),
    ("roberta_embed_dir", "CLS"),
    ("xlmr_cls_dir", "CLS"),
    ("qwen3_embed_dir", "LAST"),
    ("llama_cls_dir", "LAST"),
    ("qwen2_reward_dir", "ALL"),
    ("qwen2_prm_dir", "STEP"),
])
def test_class_default_pooling_type(request, shared_llm, fixture, expected):
    llm = shared_llm(request.getfixturevalue(fixture))
    pooling_type = _pooler(llm).pooling_type
    assert pooling_type == expected
    assert isinstance(pooling_type, str)  # a plain upper-case string, never an enum or None


def test_bert_classifier_default_is_cls(shared_llm, bert_cls_dir):
    assert _pooler(shared_llm(bert_cls_dir)).pooling_type == "CLS"


def test_embedding_defaults_to_normalize_without_st_files(shared_llm, qwen3_embed_dir):
    llm = shared_llm(qwen3_embed_dir)
    assert _pooler(llm).normalize in (True, None)  # None = the embed head's default (True)
    emb = torch.tensor(llm.embed("hello world", use_tqdm=False)[0].outputs.embedding)
    assert abs(float(emb.norm()) - 1.0) < 1e-4


# ------------------------------------------------------------------ sentence-transformers files

def test_st_pooling_file_overrides_class_default(shared_llm, bert_st_mean_dir):
    llm = shared_llm(bert_st_mean_dir)
    pooler = _pooler(llm)
    assert pooler.pooling_type == "MEAN"  # BERT's class default would be CLS
    assert pooler.normalize is False      # no Normalize module listed


def test_st_lasttoken_and_normalize(shared_llm, qwen3_st_dir, minilm_dir):
    pooler = _pooler(shared_llm(qwen3_st_dir))
    assert pooler.pooling_type == "LAST" and pooler.normalize is True
    pooler = _pooler(shared_llm(minilm_dir))
    assert pooler.pooling_type == "MEAN" and pooler.normalize is True


def test_st_max_seq_length_caps_max_model_len(shared_llm, qwen3_st_dir, minilm_dir,
                                             qwen3_embed_dir, roberta_embed_dir):
    assert _model_config(shared_llm(qwen3_st_dir)).max_model_len == 128
    assert _model_config(shared_llm(minilm_dir)).max_model_len == 256
    assert _model_config(shared_llm(qwen3_embed_dir)).max_model_len == 512
    # RoBERTa: 514 positions, offset by padding_idx + 1 -> 512 tokens
    assert _model_config(shared_llm(roberta_embed_dir)).max_model_len == 512


def test_max_model_len_above_max_seq_length_needs_the_upstream_switch(minilm_dir, monkeypatch):
    """MiniLM: 512 positions, sentence-transformers max_seq_length 256. Asking for more than
    the derived 256 is an error, as upstream, unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."""
    from vllm.engine.arg_utils import EngineArgs
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    with pytest.raises(ValueError, match="derived max_model_len .256"):
        EngineArgs(model=minilm_dir, max_model_len=300).create_engine_config()
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    cfg = EngineArgs(model=minilm_dir, max_model_len=300).create_engine_config()
    assert cfg.model_config.max_model_len == 300
    with pytest.raises(ValueError, match="position limit"):
        EngineArgs(model=minilm_dir, max_model_len=600).create_engine_config()


def test_st_without_normalize_returns_unnormalised_embeddings(shared_llm, bert_st_mean_dir):
    llm = shared_llm(bert_st_mean_dir)
    outs = llm.embed(SENTENCES, use_tqdm=False)
    got = torch.tensor([o.outputs.embedding for o in outs])
    ref = mf.st_encode(bert_st_mean_dir, SENTENCES)
    assert got.shape == ref.shape == (len(SENTENCES), 64)
    assert (got.norm(dim=-1) - 1.0).abs().min() > 1e-2   # really not normalised
    assert mf.max_abs_diff(got, ref) <= 1e-4
    for g, r in zip(got, ref):
        assert mf.cosine(g, r) >= 0.9999


def test_st_dense_module_is_applied(shared_llm, bert_st_dense_dir):
    llm = shared_llm(bert_st_dense_dir)
    outs = llm.embed(SENTENCES, use_tqdm=False)
    got = torch.tensor([o.outputs.embedding for o in outs])
    ref = mf.st_encode(bert_st_dense_dir, SENTENCES)
    assert got.shape == ref.shape == (len(SENTENCES), 32)  # Dense 64 -> 32
    assert mf.max_abs_diff(got, ref) <= 1e-4
    for g, r in zip(got, ref):
        assert mf.cosine(g, r) >= 0.9999


def test_dense_applies_to_embeddings_only_in_a_mixed_step(shared_llm, bert_st_dense_dir):
    """An embed and a raw encode request in one engine step: only the embedding goes
    through the Dense module; each equals what it gives alone."""
    from vllm import PoolingParams
    llm = shared_llm(bert_st_dense_dir)
    alone_raw = llm.encode(["Hello world"], pooling_task="encode", use_tqdm=False)[0]
    alone_emb = llm.embed(["Hello world"], use_tqdm=False)[0]
    engine = llm.llm_engine
    prompt = engine.processor.tokenize_prompt("Hello world")
    engine.add_request("mixed-embed", prompt, PoolingParams(task="embed"))
    engine.add_request("mixed-raw", prompt, PoolingParams(task="encode"))
    done = {}
    steps = engine.stats.num_steps
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step()})
    assert engine.stats.num_steps == steps + 1  # really one step
    assert done["mixed-raw"].outputs.data.shape == alone_raw.outputs.data.shape == (64,)
    assert mf.max_abs_diff(done["mixed-raw"].outputs.data, alone_raw.outputs.data) <= 1e-5
    assert mf.max_abs_diff(done["mixed-embed"].outputs.data,
                           torch.tensor(alone_emb.outputs.embedding)) <= 1e-5


def test_unsupported_st_module_is_refused_at_load(bert_st_bad_module_dir):
    with pytest.raises(ValueError) as err:
        LLM(model=bert_st_bad_module_dir)
    assert "LayerNorm" in str(err.value)


def test_unsupported_st_pooling_mode_is_refused_at_load(tmp_path, bert_st_mean_dir):
    path = mf.copy_checkpoint(bert_st_mean_dir, tmp_path / "max_pool")
    pool_cfg_path = pathlib.Path(path) / "1_Pooling" / "config.json"
    cfg = json.loads(pool_cfg_path.read_text())
    cfg.update(pooling_mode_mean_tokens=False, pooling_mode_max_tokens=True)
    pool_cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as err:
        LLM(model=str(path))
    assert "max" in str(err.value).lower()


# ------------------------------------------------------------------ user override

def _check_last_unnormalised(llm, model_dir):
    """LAST pooling, with `normalize` still taken from the ST files (false): field by field."""
    text = SENTENCES[3]
    out = llm.embed(text, use_tqdm=False)[0]
    ids = list(mf.hf_tokenizer(model_dir)(text)["input_ids"])
    ref = mf.hf_embedding(model_dir, ids, "LAST", normalize=False)
    assert mf.cosine(out.outputs.embedding, ref) >= 0.9999
    assert mf.max_abs_diff(out.outputs.embedding, ref) <= 1e-4


def test_user_override_beats_st_file(bert_st_mean_dir):
    llm = LLM(model=bert_st_mean_dir, override_pooler_config={"pooling_type": "LAST"})
    assert _pooler(llm).pooling_type == "LAST"
    assert _pooler(llm).normalize is False
    _check_last_unnormalised(llm, bert_st_mean_dir)


def test_pooler_config_alias(bert_st_mean_dir):
    llm = LLM(model=bert_st_mean_dir, pooler_config={"pooling_type": "LAST"})
    assert _pooler(llm).pooling_type == "LAST"
    _check_last_unnormalised(llm, bert_st_mean_dir)


def test_user_override_as_pooler_config_object(bert_st_mean_dir):
    from vllm.config import PoolerConfig
    llm = LLM(model=bert_st_mean_dir, override_pooler_config=PoolerConfig(pooling_type="LAST"))
    assert _pooler(llm).pooling_type == "LAST"


def test_user_override_beats_class_default(bert_embed_dir, qwen3_embed_dir):
    llm = LLM(model=bert_embed_dir, override_pooler_config={"pooling_type": "MEAN",
                                                            "normalize": False})
    assert _pooler(llm).pooling_type == "MEAN" and _pooler(llm).normalize is False
    text = SENTENCES[1]
    ids = list(mf.hf_tokenizer(bert_embed_dir)(text)["input_ids"])
    out = llm.embed(text, use_tqdm=False)[0]
    ref = mf.hf_embedding(bert_embed_dir, ids, "MEAN", normalize=False)
    assert mf.max_abs_diff(out.outputs.embedding, ref) <= 1e-4

    llm = LLM(model=qwen3_embed_dir, override_pooler_config={"pooling_type": "mean"})
    assert _pooler(llm).pooling_type == "MEAN"  # normalised to upper case


@pytest.mark.parametrize("fixture,row", [("qwen3_cls_dir", -1), ("bert_cls_dir", 0)])
def test_classifier_checkpoint_served_as_embed(request, fixture, row):
    """convert='embed' serves a classifier's backbone (its head weights are skipped):
    LAST for a causal classifier, CLS for BERT, normalised."""
    path = request.getfixturevalue(fixture)
    llm = LLM(path, convert="embed")
    mc = llm.llm_engine.vllm_config.model_config
    assert mc.convert == "embed" and "embed" in mc.supported_tasks
    tok = mf.hf_tokenizer(path)
    text = mf.text_of_length(tok, 20, seed=3)
    ids = tok(text)["input_ids"]
    got = torch.tensor(llm.embed(text, use_tqdm=False)[0].outputs.embedding)
    want = torch.nn.functional.normalize(mf.hf_hidden_states(path, ids)[row], dim=0)
    assert torch.nn.functional.cosine_similarity(got, want, dim=0) >= 0.9999


def test_st_do_lower_case_lowers_the_text_as_sentence_transformers_does(
        shared_llm, qwen3_st_dir, tmp_path):
    """sentence_bert_config.json `do_lower_case: true` on a cased tokenizer: the text is
    lower-cased before tokenizing (sentence-transformers does it in Python; a fast
    tokenizer ignores a do_lower_case attribute)."""
    lowered = mf.copy_checkpoint(qwen3_st_dir, tmp_path / "lower")
    cfg_path = lowered / "sentence_bert_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "do_lower_case": True}))
    llm = shared_llm(lowered)
    sentences = [SENTENCES[0], SENTENCES[2], SENTENCES[3]]  # under its max_seq_length, 128
    got = torch.tensor([o.outputs.embedding for o in llm.embed(sentences, use_tqdm=False)])
    ref = mf.st_encode(lowered, sentences)
    assert mf.max_abs_diff(got, ref) <= 1e-4
    cased = shared_llm(qwen3_st_dir).embed(SENTENCES[:1], use_tqdm=False)[0].outputs.embedding
    assert mf.cosine(got[0], cased) < 0.999  # "Hello world" really was tokenized otherwise
    tok = mf.hf_tokenizer(qwen3_st_dir)
    processor = llm.llm_engine.processor
    assert processor.tokenize_prompt("Hello World").prompt_token_ids == \
        tok("hello world")["input_ids"] != tok("Hello World")["input_ids"]
    assert processor.tokenize_pair("Hello", "World").prompt_token_ids == \
        tok("hello", "world")["input_ids"]


def test_st_settings_file_named_after_the_family_is_read(bert_st_mean_dir, tmp_path):
    """sentence-transformers names the Transformer module's settings file after the model
    family (e.g. sentence_xlm-roberta_config.json); its max_seq_length still applies."""
    from vllm.engine.arg_utils import EngineArgs
    copy = mf.copy_checkpoint(bert_st_mean_dir, tmp_path / "xlmr_named")
    (copy / "sentence_bert_config.json").unlink()
    (copy / "sentence_xlm-roberta_config.json").write_text(
        json.dumps({"max_seq_length": 48, "do_lower_case": False}))
    assert EngineArgs(model=str(copy)).create_engine_config().model_config.max_model_len == 48


def test_configured_softmax_over_one_label_scores_by_sigmoid(shared_llm, qwen3_cls_dir,
                                                             tmp_path):
    """A one-label cross-encoder whose config names Softmax: a softmax over one value is
    always 1, so the score is the sigmoid, as upstream."""
    plain = shared_llm(qwen3_cls_dir).score("q", ["a doc", "another"], use_tqdm=False)
    copy = mf.edit_config(mf.copy_checkpoint(qwen3_cls_dir, tmp_path / "softmax_ce"),
                          sentence_transformers={
                              "activation_fn": "torch.nn.modules.activation.Softmax"})
    got = shared_llm(copy).score("q", ["a doc", "another"], use_tqdm=False)
    assert [o.outputs.score for o in got] == pytest.approx([o.outputs.score for o in plain])
    assert len({round(o.outputs.score, 6) for o in got}) == 2  # not all 1.0
