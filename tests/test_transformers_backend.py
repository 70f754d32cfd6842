"""The Transformers backend (`model_impl`): architectures the engine lacks, run through
transformers' classes with the engine's attention, equal to transformers on tiny seeded
checkpoints; causal ones also with prefix caching and chunked prefill, exactly."""
from __future__ import annotations

import pathlib

import pytest
import torch

import model_factory as mf
from vllm import LLM

ATOL = 1e-4


def _tiny_causal(root: pathlib.Path, name: str, config_cls: str, head: str,
                 **overrides) -> str:
    """A tiny causal-LM classifier of a family the engine has no native class for."""
    import transformers
    path = mf._fresh(root / name)
    eos = mf.bpe_token_id(mf.BPE_EOS)
    cfg = getattr(transformers, config_cls)(
        vocab_size=mf.BPE_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, tie_word_embeddings=False,
        **overrides)
    torch.manual_seed(mf.SEED + 11)
    model = getattr(transformers, head)(cfg)
    mf._perturb(model)
    mf._save(model, path)
    mf.save_bpe_tokenizer(path)
    return str(path)


def _tiny_encoder(root: pathlib.Path, name: str, config_cls: str, model_cls: str,
                  **config) -> str:
    """A tiny bidirectional encoder with MEAN pooling through sentence-transformers files."""
    import transformers
    path = mf._fresh(root / name)
    cfg = getattr(transformers, config_cls)(vocab_size=mf.BERT_VOCAB, **config)
    torch.manual_seed(mf.SEED + 12)
    model = getattr(transformers, model_cls)(cfg)
    mf._perturb(model)
    mf._save(model, path)
    mf.save_bert_tokenizer(path, model_input_names=["input_ids", "attention_mask"])
    mf.edit_config(path, hidden_size=cfg.hidden_size)  # DistilBERT's is an alias of `dim`
    mf.write_st_files(path, pooling="mean", normalize=True, max_seq_length=128)
    return str(path)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("transformers_backend")


@pytest.fixture(scope="module")
def phi3_dir(root) -> str:
    return _tiny_causal(root, "phi3", "Phi3Config", "Phi3ForSequenceClassification",
                        num_labels=3)


@pytest.fixture(scope="module")
def olmo2_dir(root) -> str:
    return _tiny_causal(root, "olmo2", "Olmo2Config", "Olmo2ForSequenceClassification",
                        num_labels=1)


@pytest.fixture(scope="module")
def qwen3_moe_dir(root) -> str:
    return _tiny_causal(root, "qwen3_moe", "Qwen3MoeConfig",
                        "Qwen3MoeForSequenceClassification", num_labels=2, head_dim=16,
                        moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)


@pytest.fixture(scope="module")
def distilbert_dir(root) -> str:
    return _tiny_encoder(root, "distilbert", "DistilBertConfig", "DistilBertModel", dim=64,
                         hidden_dim=128, n_layers=2, n_heads=4, max_position_embeddings=256)


@pytest.fixture(scope="module")
def mpnet_dir(root) -> str:
    return _tiny_encoder(root, "mpnet", "MPNetConfig", "MPNetModel", hidden_size=64,
                         intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=258)


def _prompts(path: str, lengths=(3, 70, 17, 41)) -> list[str]:
    return mf.mixed_prompts(mf.hf_tokenizer(path), lengths)


def _check_probs(llm: LLM, path: str, prompts: list[str]):
    outs = llm.classify(prompts, use_tqdm=False)
    for out in outs:
        ref = mf.probs_from_logits(mf.hf_seqcls_logits(path, out.prompt_token_ids))
        assert mf.max_abs_diff(torch.tensor(out.outputs.probs), ref) <= ATOL
    return outs


def _check_embeddings(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert mf.cosine(got, ref) >= 0.9999
    assert abs(got.norm().item() / ref.norm().item() - 1) <= 1e-3


@pytest.mark.parametrize("name", ["phi3_dir", "olmo2_dir", "qwen3_moe_dir"])
def test_causal_classifier_equals_transformers_cached_and_chunked(name, request, vllm_log,
                                                                   attention_backend):
    path = request.getfixturevalue(name)
    llm = LLM(path, dtype="float32", max_num_batched_tokens=32, block_size=16)
    assert "Transformers backend" in vllm_log.text
    assert llm.llm_engine.runner.attention_backend == attention_backend
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.impl == "transformers"
    assert cfg.cache_config.enable_prefix_caching and cfg.scheduler_config.enable_chunked_prefill
    tok = mf.hf_tokenizer(path)
    shared = mf.text_of_length(tok, 40, seed=3)
    prompts = [shared + " " + p for p in _prompts(path)]
    first = _check_probs(llm, path, prompts)          # chunked (budget 32 < prompt lengths)
    second = _check_probs(llm, path, prompts)         # now from the prefix cache
    assert all(o.num_cached_tokens > 0 for o in second)
    assert llm.llm_engine.stats.num_split_requests > 0
    whole = LLM(path, dtype="float32", enable_prefix_caching=False,
                enable_chunked_prefill=False)
    for a, b, c in zip(first, second, whole.classify(prompts, use_tqdm=False)):
        assert c.num_cached_tokens == 0
        assert mf.max_abs_diff(a.outputs.probs, c.outputs.probs) <= ATOL
        assert mf.max_abs_diff(b.outputs.probs, c.outputs.probs) <= ATOL


def test_model_impl_vllm_refuses_a_backend_architecture(phi3_dir):
    with pytest.raises(ValueError, match="--model-impl transformers"):
        LLM(phi3_dir, model_impl="vllm")


def test_model_impl_transformers_equals_native_qwen3(shared_llm, qwen3_embed_dir, vllm_log):
    backend = LLM(qwen3_embed_dir, dtype="float32", model_impl="transformers")
    assert backend.llm_engine.vllm_config.model_config.impl == "transformers"
    native = shared_llm(qwen3_embed_dir)
    assert native.llm_engine.vllm_config.model_config.impl == "vllm"
    prompts = _prompts(qwen3_embed_dir)
    for a, b in zip(backend.embed(prompts, use_tqdm=False),
                    native.embed(prompts, use_tqdm=False)):
        _check_embeddings(torch.tensor(a.outputs.embedding), torch.tensor(b.outputs.embedding))


@pytest.mark.parametrize("name,whole", [("distilbert_dir", False), ("mpnet_dir", True)])
def test_encoder_mean_embeddings_equal_transformers(name, whole, request, vllm_log):
    """DistilBERT takes the engine's attention (bidirectional, no cache); MPNet's relative
    position bias cannot, so it runs each request whole, with one WARNING."""
    path = request.getfixturevalue(name)
    llm = LLM(path, dtype="float32", model_impl="transformers")
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.whole_sequences is whole
    assert not cfg.cache_config.enable_prefix_caching
    assert not cfg.scheduler_config.enable_chunked_prefill
    warned = [r for r in vllm_log.records if r.levelname == "WARNING"
              and "Transformers backend" in r.getMessage()]
    assert len(warned) == (1 if whole else 0)
    assert cfg.model_config.pooler_config.pooling_type == "MEAN"
    layers = llm.llm_engine.runner.model.model.attention_layers()
    assert len(layers) == (0 if whole else 2)
    for out in llm.embed(_prompts(path), use_tqdm=False):
        ref = mf.hf_embedding(path, out.prompt_token_ids, "MEAN", normalize=True)
        _check_embeddings(torch.tensor(out.outputs.embedding), ref)


def test_whole_sequence_model_refuses_nothing_silently(mpnet_dir, vllm_log):
    """Asking for prefix caching on a whole-sequence backend model turns it off, loudly."""
    llm = LLM(mpnet_dir, dtype="float32", model_impl="transformers", enable_prefix_caching=True)
    assert not llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    assert any("Prefix caching" in r.getMessage() and r.levelname == "WARNING"
               for r in vllm_log.records)


def test_probe_that_sees_no_attention_call_runs_whole(olmo2_dir, monkeypatch, vllm_log):
    """A class that claims to take an external attention function but never calls it is
    found by the load-time probe: caching and chunking go off, results stay exact."""
    from vllm.model_executor.models import transformers_attention as ta
    monkeypatch.setattr(ta.AttentionProbe, "record", lambda self, *args: None)
    llm = LLM(olmo2_dir, dtype="float32")
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.whole_sequences
    assert not cfg.cache_config.enable_prefix_caching
    assert not cfg.scheduler_config.enable_chunked_prefill
    assert not llm.llm_engine.runner.kv_caches
    assert any("never called" in r.getMessage() and r.levelname == "WARNING"
               for r in vllm_log.records)
    outs = _check_probs(llm, olmo2_dir, _prompts(olmo2_dir) * 2)
    assert all(o.num_cached_tokens == 0 for o in outs)
