"""`convert` (upstream's --convert / as_embedding_model / as_seq_cls_model) on causal LMs the
engine has no native class for, through the Transformers backend, `hf_overrides` included:
each equal to transformers on a tiny seeded checkpoint, cached = uncached."""
from __future__ import annotations

import pathlib

import pytest
import torch

import model_factory as mf
from vllm import LLM

ATOL = 1e-4
_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("upstream_conversions")


def _save(root: pathlib.Path, name: str, model) -> str:
    path = mf._fresh(root / name)
    mf._perturb(model)
    mf._save(model, path)
    mf.save_bpe_tokenizer(path)
    return str(path)


def _causal(root, name: str, config_cls: str, model_cls: str, seed: int, **config) -> str:
    import transformers
    eos = mf.bpe_token_id(mf.BPE_EOS)
    cfg = getattr(transformers, config_cls)(
        vocab_size=mf.BPE_VOCAB, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
        tie_word_embeddings=False, **config)
    torch.manual_seed(mf.SEED + seed)
    return _save(root, name, getattr(transformers, model_cls)(cfg))


@pytest.fixture(scope="module")
def lm_dirs(root) -> dict[str, str]:
    """Causal LMs (lm_head, no score head) of families the engine lacks natively."""
    return {
        "Phi3ForCausalLM": _causal(root, "phi3", "Phi3Config", "Phi3ForCausalLM", 41,
                                   **_SMALL),
        "GPT2LMHeadModel": _causal(root, "gpt2", "GPT2Config", "GPT2LMHeadModel", 42,
                                   n_embd=64, n_layer=2, n_head=4, n_positions=512),
        "Olmo2ForCausalLM": _causal(root, "olmo2", "Olmo2Config", "Olmo2ForCausalLM", 43,
                                    **_SMALL),
    }


def _prompts(path: str, lengths=(3, 70, 17, 41)) -> list[str]:
    tok = mf.hf_tokenizer(path)
    shared = mf.text_of_length(tok, 40, seed=5)
    return [shared + " " + p for p in mf.mixed_prompts(tok, lengths)]


def _check_embeddings(got, ref: torch.Tensor) -> None:
    got = torch.as_tensor(got)
    assert mf.cosine(got, ref) >= 0.9999
    assert abs(got.norm().item() / ref.norm().item() - 1) <= 1e-3


def _embed_twice(llm: LLM, prompts: list[str]):
    """Chunked first (budget 32), then from the prefix cache; both returned."""
    first = llm.embed(prompts, use_tqdm=False)
    second = llm.embed(prompts, use_tqdm=False)
    assert all(o.num_cached_tokens > 0 for o in second)
    return first, second


@pytest.mark.parametrize("arch", ["Phi3ForCausalLM", "GPT2LMHeadModel"])
def test_causal_lm_converted_to_embed_equals_transformers(arch, lm_dirs):
    """LAST pooling, normalized: transformers' last hidden state of the base model; the
    prefix cache and chunked prefill are on (a causal LAST model) and change nothing."""
    path = lm_dirs[arch]
    llm = LLM(path, dtype="float32", convert="embed", max_num_batched_tokens=32,
              block_size=16)
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.impl == "transformers" and cfg.model_config.architecture == arch
    assert cfg.model_config.pooler_config.pooling_type == "LAST"
    assert cfg.cache_config.enable_prefix_caching and cfg.scheduler_config.enable_chunked_prefill
    first, second = _embed_twice(llm, _prompts(path))
    for a, b in zip(first, second):
        ref = mf.hf_embedding(path, a.prompt_token_ids, "LAST")
        _check_embeddings(a.outputs.embedding, ref)
        _check_embeddings(b.outputs.embedding, ref)


def test_is_causal_override_makes_a_bidirectional_embedder(lm_dirs):
    """hf_overrides {"is_causal": false}: every token sees every other (the reference gets
    an explicit all-true mask); caching and chunking go off by default."""
    path = lm_dirs["Olmo2ForCausalLM"]
    llm = LLM(path, dtype="float32", convert="embed", hf_overrides={"is_causal": False},
              override_pooler_config={"pooling_type": "MEAN"})
    cfg = llm.llm_engine.vllm_config
    assert not cfg.model_config.is_causal and not cfg.cache_config.enable_prefix_caching
    for out in llm.embed(_prompts(path), use_tqdm=False):
        ref = mf.hf_embedding(path, out.prompt_token_ids, "MEAN", bidirectional=True)
        _check_embeddings(out.outputs.embedding, ref)


@pytest.fixture(scope="module")
def phi3_seqcls_dir(root) -> str:
    return _causal(root, "phi3_seqcls", "Phi3Config", "Phi3ForSequenceClassification", 44,
                   num_labels=3, **_SMALL)


def test_classify_conversion_loads_the_score_head(phi3_seqcls_dir):
    """A classifier checkpoint named as its causal LM (hf_overrides architectures) and
    converted to classify: the causal base plus `score` from the checkpoint, LAST token;
    probabilities equal transformers' *ForSequenceClassification, cached = uncached."""
    path = phi3_seqcls_dir
    llm = LLM(path, dtype="float32", convert="classify", max_num_batched_tokens=32,
              block_size=16, hf_overrides={"architectures": ["Phi3ForCausalLM"]})
    mc = llm.llm_engine.vllm_config.model_config
    assert (mc.impl, mc.architecture, mc.convert) == ("transformers", "Phi3ForCausalLM",
                                                      "classify")
    prompts = _prompts(path)
    first = llm.classify(prompts, use_tqdm=False)
    second = llm.classify(prompts, use_tqdm=False)
    assert all(o.num_cached_tokens > 0 for o in second)
    for a, b in zip(first, second):
        ref = mf.probs_from_logits(mf.hf_seqcls_logits(path, a.prompt_token_ids))
        assert mf.max_abs_diff(torch.tensor(a.outputs.probs), ref) <= ATOL
        assert mf.max_abs_diff(torch.tensor(b.outputs.probs), ref) <= ATOL


def test_classify_without_a_score_head_is_refused(lm_dirs):
    with pytest.raises(ValueError, match=r"no weights for the classify head.*score\.weight"):
        LLM(lm_dirs["Olmo2ForCausalLM"], dtype="float32", convert="classify")


def test_classifier_from_token_override_on_a_backend_lm(lm_dirs):
    """Upstream's Qwen3-Reranker recipe on any causal LM: hf_overrides name the
    *ForSequenceClassification class, the two tokens and the original-reranker flag; the
    score is sigmoid(logit(yes) - logit(no)) of transformers' LM head at the last token."""
    path = lm_dirs["Olmo2ForCausalLM"]
    tok = mf.hf_tokenizer(path)
    no, yes = tok.convert_ids_to_tokens([100, 101])  # two ordinary tokens of the BPE vocab
    llm = LLM(path, dtype="float32", hf_overrides={
        "architectures": ["Olmo2ForSequenceClassification"],
        "classifier_from_token": [no, yes], "is_original_qwen3_reranker": True})
    ids = [tok.convert_tokens_to_ids(t) for t in (no, yes)]
    for out in llm.classify(_prompts(path, (3, 17)), use_tqdm=False):
        logits = mf.hf_lm_logits(path, out.prompt_token_ids)
        ref = torch.sigmoid(logits[ids[1]] - logits[ids[0]])
        assert abs(out.outputs.probs[0] - ref.item()) <= ATOL


def _text(eos: int) -> dict:
    return dict(vocab_size=mf.BPE_VOCAB, head_dim=16, bos_token_id=eos, eos_token_id=eos,
                pad_token_id=eos, **_SMALL)


def _gemma3_vl(root) -> str:
    import transformers
    eos, top = mf.bpe_token_id(mf.BPE_EOS), mf.BPE_VOCAB
    cfg = transformers.Gemma3Config(
        text_config=dict(_text(eos), sliding_window=64),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=top - 1, boi_token_index=top - 2,
        eoi_token_index=top - 3, tie_word_embeddings=False)
    torch.manual_seed(mf.SEED + 45)
    return _save(root, "gemma3_vl", transformers.Gemma3ForConditionalGeneration(cfg))


def _qwen2_5_vl(root) -> str:
    import transformers
    eos, top = mf.bpe_token_id(mf.BPE_EOS), mf.BPE_VOCAB
    cfg = transformers.Qwen2_5_VLConfig(
        text_config=dict(_text(eos), rope_scaling={"type": "mrope",
                                                   "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, window_size=56, fullatt_block_indexes=[0]),
        image_token_id=top - 1, video_token_id=top - 2, vision_start_token_id=top - 3,
        tie_word_embeddings=False)
    torch.manual_seed(mf.SEED + 46)
    return _save(root, "qwen2_5_vl", transformers.Qwen2_5_VLForConditionalGeneration(cfg))


@pytest.mark.parametrize("build", [_gemma3_vl, _qwen2_5_vl])
def test_vision_language_model_as_a_text_embedder(build, root):
    """A verified *ForConditionalGeneration fed text alone: transformers' base model's last
    hidden state (Qwen2.5-VL's M-RoPE positions are the text positions three times), with
    the prefix cache and chunked prefill on (the model is served as text-only)."""
    path = build(root)
    llm = LLM(path, dtype="float32", convert="embed", max_num_batched_tokens=32,
              block_size=16)
    mc = llm.llm_engine.vllm_config.model_config
    assert mc.impl == "transformers" and not mc.is_multimodal
    first, second = _embed_twice(llm, _prompts(path))
    for a, b in zip(first, second):
        ref = mf.hf_embedding(path, a.prompt_token_ids, "LAST")
        _check_embeddings(a.outputs.embedding, ref)
        _check_embeddings(b.outputs.embedding, ref)


def test_unverified_vision_language_model_is_refused(root):
    import transformers
    eos = mf.bpe_token_id(mf.BPE_EOS)
    cfg = transformers.PaliGemmaConfig(text_config=_text(eos),
                                       architectures=["PaliGemmaForConditionalGeneration"])
    path = mf._fresh(root / "paligemma")
    cfg.save_pretrained(path)  # refused from its config: no weights needed
    with pytest.raises(ValueError, match="PaliGemmaForConditionalGeneration takes images"):
        LLM(str(path), convert="embed")
