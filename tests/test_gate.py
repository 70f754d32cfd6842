"""The gate: prefix caching and chunked prefill run exactly when pooling is LAST and the
attention is causal, and the decision is visible where vLLM users look for it.

Most cases resolve a config only (`EngineArgs(...).create_engine_config()`, no weights);
a few build a real `LLM` to check the decision at `llm.llm_engine.vllm_config` and that a
forced-on flag on an unsupported model changes no number.
"""
from __future__ import annotations

import logging

import pytest
import torch

import model_factory as mf
from vllm import LLM
from vllm.config import ModelConfig, PoolerConfig
from vllm.config.gate import prefix_features_supported, resolve_feature
from vllm.config.scheduler import DEFAULT_MAX_NUM_BATCHED_TOKENS
from vllm.engine.arg_utils import EngineArgs




def _config(model_dir: str, **kwargs):
    return EngineArgs(model=model_dir, **kwargs).create_engine_config()


def _flags(cfg) -> tuple[bool, bool]:
    return cfg.cache_config.enable_prefix_caching, cfg.scheduler_config.enable_chunked_prefill


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# ------------------------------------------------------------------ default decisions

GATE_CASES = [
    # fixture,             resolved pooling, supported, words the reason must contain
    ("qwen3_embed_dir", "LAST", True, "LAST"),
    ("qwen2_embed_dir", "LAST", True, "LAST"),
    ("llama_embed_dir", "LAST", True, "LAST"),
    ("qwen3_st_dir", "LAST", True, "LAST"),            # ST lasttoken pooling
    ("qwen3_cls_dir", "LAST", True, "LAST"),           # causal *ForSequenceClassification
    ("llama_cls_dir", "LAST", True, "LAST"),
    ("bert_cls_dir", "CLS", False, "encoder-only"),
    ("xlmr_cls_dir", "CLS", False, "encoder-only"),
    ("bert_embed_dir", "CLS", False, "encoder-only"),
    ("roberta_embed_dir", "CLS", False, "encoder-only"),
    ("bert_st_mean_dir", "MEAN", False, "encoder-only"),
    ("qwen2_bidir_dir", "LAST", False, "is_causal"),    # LAST, but bidirectional
    ("qwen2_reward_dir", "ALL", False, "ALL"),
    ("qwen2_prm_dir", "STEP", False, "STEP"),
]


@pytest.mark.parametrize("fixture,pooling,supported,reason_word", GATE_CASES,
                         ids=[c[0] for c in GATE_CASES])
def test_gate_default_decision(request, fixture, pooling, supported, reason_word):
    model_dir = request.getfixturevalue(fixture)
    cfg = _config(model_dir)
    assert cfg.model_config.pooler_config.pooling_type == pooling
    ok, reason = prefix_features_supported(cfg.model_config)
    assert ok is supported
    assert reason_word in reason, reason
    # Unset flags take the gate's value, as real bools.
    assert _flags(cfg) == (supported, supported)
    assert type(cfg.cache_config.enable_prefix_caching) is bool
    assert type(cfg.scheduler_config.enable_chunked_prefill) is bool


def test_gate_is_causal_false_via_hf_overrides(qwen2_embed_dir):
    cfg = _config(qwen2_embed_dir, hf_overrides={"is_causal": False})
    assert cfg.model_config.pooler_config.pooling_type == "LAST"
    ok, reason = prefix_features_supported(cfg.model_config)
    assert not ok and "bidirectional" in reason
    assert _flags(cfg) == (False, False)


@pytest.mark.parametrize("pooling", ["MEAN", "CLS", "ALL"])
def test_user_pooling_override_turns_features_off(qwen3_embed_dir, pooling):
    cfg = _config(qwen3_embed_dir, override_pooler_config={"pooling_type": pooling})
    assert cfg.model_config.pooler_config.pooling_type == pooling
    ok, reason = prefix_features_supported(cfg.model_config)
    assert not ok and pooling in reason
    assert _flags(cfg) == (False, False)


def test_user_pooling_override_last_keeps_features_on(qwen3_embed_dir):
    cfg = _config(qwen3_embed_dir, override_pooler_config=PoolerConfig(pooling_type="last"))
    assert cfg.model_config.pooler_config.pooling_type == "LAST"
    assert _flags(cfg) == (True, True)


def test_last_pooling_on_an_encoder_stays_off(bert_embed_dir):
    """LAST alone is not enough: BERT is bidirectional."""
    cfg = _config(bert_embed_dir, override_pooler_config={"pooling_type": "LAST"})
    assert cfg.model_config.pooler_config.pooling_type == "LAST"
    assert _flags(cfg) == (False, False)


def test_gate_on_model_config_alone(qwen3_cls_dir, bert_cls_dir):
    """The gate needs nothing but a ModelConfig."""
    assert prefix_features_supported(ModelConfig(model=qwen3_cls_dir))[0] is True
    assert prefix_features_supported(ModelConfig(model=bert_cls_dir))[0] is False
    mean = ModelConfig(model=qwen3_cls_dir, override_pooler_config={"pooling_type": "MEAN"})
    assert prefix_features_supported(mean)[0] is False


# ------------------------------------------------------------------ explicit user values

@pytest.mark.parametrize("fixture,reason_word", [("bert_cls_dir", "encoder-only"),
                                                 ("xlmr_cls_dir", "encoder-only"),
                                                 ("qwen2_bidir_dir", "is_causal")])
def test_forced_on_for_unsupported_model_warns_and_stays_off(request, vllm_log, fixture,
                                                             reason_word):
    model_dir = request.getfixturevalue(fixture)
    cfg = _config(model_dir, enable_prefix_caching=True, enable_chunked_prefill=True,
                  max_num_batched_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS)
    assert _flags(cfg) == (False, False)
    warnings = _warnings(vllm_log)
    prefix = [w for w in warnings if "Prefix caching" in w]
    chunked = [w for w in warnings if "Chunked prefill" in w]
    assert len(prefix) == 1 and len(chunked) == 1, warnings
    for w in prefix + chunked:
        assert reason_word in w, w
        assert "disabled" in w, w


@pytest.mark.parametrize("fixture,override", [("qwen2_reward_dir", None),
                                              ("qwen2_prm_dir", None),
                                              ("qwen3_embed_dir", "MEAN"),
                                              ("qwen3_embed_dir", "CLS"),
                                              ("qwen3_embed_dir", "ALL")])
def test_forced_on_for_causal_non_last_pooling_runs_exactly(request, vllm_log, fixture,
                                                           override):
    """Issue 27: on a causal model every pooling type gets both features when asked (the
    pooler's payload makes them exact); the log says so, and nothing warns."""
    model_dir = request.getfixturevalue(fixture)
    kwargs = {"override_pooler_config": {"pooling_type": override}} if override else {}
    assert _flags(_config(model_dir, **kwargs)) == (False, False)  # the default stays off
    vllm_log.clear()
    cfg = _config(model_dir, enable_prefix_caching=True, enable_chunked_prefill=True,
                  max_num_batched_tokens=32, **kwargs)
    assert _flags(cfg) == (True, True)
    assert cfg.scheduler_config.max_num_batched_tokens == 32
    info = [r.getMessage() for r in vllm_log.records if r.levelno == logging.INFO]
    for name in ("Prefix caching", "Chunked prefill"):
        assert sum(m.startswith(f"{name} enabled as requested") and "exactly" in m
                   for m in info) == 1, info
    assert not _warnings(vllm_log)


def test_caplog_really_captures_vllm_logs(vllm_log, qwen3_embed_dir):
    """Guard on the fixture above: the INFO decision lines of a supported model arrive."""
    _config(qwen3_embed_dir)
    messages = [r.getMessage() for r in vllm_log.records]
    assert any("Prefix caching enabled" in m for m in messages), messages
    assert not _warnings(vllm_log)


def test_startup_log_names_each_decision_and_the_pooler(vllm_log, qwen3_cls_dir, bert_cls_dir):
    _config(qwen3_cls_dir)
    info = [r.getMessage() for r in vllm_log.records if r.levelno == logging.INFO]
    assert sum("Prefix caching enabled" in m and "LAST" in m and "causal" in m
               for m in info) == 1, info
    assert sum("Chunked prefill enabled" in m and "LAST" in m for m in info) == 1, info
    assert any("PoolerConfig(" in m and "pooling_type='LAST'" in m for m in info), info
    vllm_log.clear()
    _config(bert_cls_dir)
    info = [r.getMessage() for r in vllm_log.records if r.levelno == logging.INFO]
    assert sum("Prefix caching disabled" in m and "encoder-only" in m for m in info) == 1, info
    assert sum("Chunked prefill disabled" in m and "encoder-only" in m for m in info) == 1, info
    assert any("PoolerConfig(" in m and "pooling_type='CLS'" in m for m in info), info
    assert not any("pooling_type=None" in m for m in info), info
    assert not _warnings(vllm_log)


def test_explicit_values_on_supported_model_are_honoured(vllm_log, qwen3_cls_dir):
    cfg = _config(qwen3_cls_dir, enable_prefix_caching=False, enable_chunked_prefill=True,
                  max_num_batched_tokens=32)
    assert _flags(cfg) == (False, True)
    cfg = _config(qwen3_cls_dir, enable_prefix_caching=True, enable_chunked_prefill=False)
    assert _flags(cfg) == (True, False)
    assert not _warnings(vllm_log)


def test_resolve_feature_directly(vllm_log, qwen3_cls_dir, bert_cls_dir):
    causal, bert = ModelConfig(model=qwen3_cls_dir), ModelConfig(model=bert_cls_dir)
    assert resolve_feature("Prefix caching", None, causal) is True
    assert resolve_feature("Prefix caching", None, bert) is False
    assert resolve_feature("Prefix caching", False, causal) is False
    assert resolve_feature("Prefix caching", True, causal) is True
    assert not _warnings(vllm_log)
    assert resolve_feature("Prefix caching", True, bert) is False
    assert len(_warnings(vllm_log)) == 1
    assert resolve_feature("Prefix caching", False, bert) is False
    assert len(_warnings(vllm_log)) == 1  # asking for off is never warned about


# ------------------------------------------------------------------ token budget

def test_budget_below_max_model_len_without_chunking_is_an_error(qwen3_cls_dir, bert_cls_dir):
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        _config(qwen3_cls_dir, enable_chunked_prefill=False, max_num_batched_tokens=100)
    # BERT never chunks: same error, and a forced-on flag does not rescue it.
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        _config(bert_cls_dir, max_num_batched_tokens=256)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        _config(bert_cls_dir, enable_chunked_prefill=True, max_num_batched_tokens=32)
    # Equal to max_model_len is fine; so is a lower max_model_len.
    assert _config(bert_cls_dir, max_num_batched_tokens=512) \
        .scheduler_config.max_num_batched_tokens == 512
    assert _config(bert_cls_dir, max_num_batched_tokens=256, max_model_len=256) \
        .scheduler_config.max_num_batched_tokens == 256
    # With chunking a budget far below max_model_len is fine.
    cfg = _config(qwen3_cls_dir, max_num_batched_tokens=32)
    assert cfg.scheduler_config.max_num_batched_tokens == 32
    assert cfg.model_config.max_model_len > 32


def test_default_budget(qwen3_cls_dir, bert_cls_dir):
    assert _config(qwen3_cls_dir).scheduler_config.max_num_batched_tokens == \
        DEFAULT_MAX_NUM_BATCHED_TOKENS == 8192
    assert _config(bert_cls_dir).scheduler_config.max_num_batched_tokens == 8192
    # Chunking off and max_model_len above 8192: the budget rises to max_model_len.
    big = {"max_position_embeddings": 10000}
    cfg = _config(qwen3_cls_dir, hf_overrides=big, enable_chunked_prefill=False)
    assert cfg.model_config.max_model_len == 10000
    assert cfg.scheduler_config.max_num_batched_tokens == 10000
    cfg = _config(qwen3_cls_dir, hf_overrides=big)
    assert cfg.scheduler_config.enable_chunked_prefill is True
    assert cfg.scheduler_config.max_num_batched_tokens == 8192


# ------------------------------------------------------------------ through LLM(...)

def test_llm_exposes_decisions(shared_llm, qwen3_cls_dir, qwen3_embed_dir, bert_cls_dir,
                               qwen2_bidir_dir):
    for model_dir, pooling, on in [(qwen3_cls_dir, "LAST", True),
                                   (qwen3_embed_dir, "LAST", True),
                                   (bert_cls_dir, "CLS", False),
                                   (qwen2_bidir_dir, "LAST", False)]:
        cfg = shared_llm(model_dir).llm_engine.vllm_config
        assert cfg.cache_config.enable_prefix_caching is on, model_dir
        assert cfg.scheduler_config.enable_chunked_prefill is on, model_dir
        assert cfg.model_config.pooler_config.pooling_type == pooling, model_dir


def test_llm_bidirectional_models_keep_no_kv_cache(shared_llm, bert_cls_dir, qwen2_bidir_dir,
                                                   qwen3_cls_dir):
    assert shared_llm(bert_cls_dir).llm_engine.runner.kv_caches == []
    assert shared_llm(qwen2_bidir_dir).llm_engine.runner.kv_caches == []
    assert len(shared_llm(qwen3_cls_dir).llm_engine.runner.kv_caches) > 0


def test_llm_forced_on_bert_warns_and_changes_no_number(vllm_log, shared_llm, bert_cls_dir):
    forced = LLM(bert_cls_dir, enable_prefix_caching=True, enable_chunked_prefill=True)
    warnings = _warnings(vllm_log)
    assert any("Prefix caching" in w and "encoder-only" in w for w in warnings), warnings
    assert any("Chunked prefill" in w and "encoder-only" in w for w in warnings), warnings
    cfg = forced.llm_engine.vllm_config
    assert cfg.cache_config.enable_prefix_caching is False
    assert cfg.scheduler_config.enable_chunked_prefill is False
    assert cfg.scheduler_config.max_num_batched_tokens >= cfg.model_config.max_model_len

    tok = mf.hf_tokenizer(bert_cls_dir)
    shared = mf.text_of_length(tok, 120, seed=7)
    prompts = [shared + " " + mf.text_of_length(tok, n, seed=20 + n) for n in (3, 30, 60)]
    prompts = prompts + prompts  # the second copies would hit if caching ran
    got = forced.classify(prompts, use_tqdm=False)
    ref = shared_llm(bert_cls_dir).classify(prompts, use_tqdm=False)
    for g, r in zip(got, ref):
        assert g.num_cached_tokens == 0
        assert mf.max_abs_diff(g.outputs.probs, r.outputs.probs) <= 1e-4
        expect = mf.probs_from_logits(mf.hf_seqcls_logits(bert_cls_dir, g.prompt_token_ids,
                                                          _types(tok, g.prompt_token_ids)))
        assert mf.max_abs_diff(torch.tensor(g.outputs.probs), expect) <= 1e-4
    stats = forced.llm_engine.stats
    assert stats.prefix_cache_queries == 0 and stats.prefix_cache_hits == 0
    assert stats.num_split_requests == 0


def _types(tok, ids):
    return [0] * len(ids) if "token_type_ids" in tok.model_input_names else None
