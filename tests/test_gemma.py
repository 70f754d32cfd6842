"""Gemma 2 and Gemma 3 through `LLM` equal Transformers (eager attention: its SDPA path drops
the softcapping) and sentence-transformers (EmbeddingGemma), in float32.

The tiny models slide a 12-token window on alternate layers (EmbeddingGemma's tiny twin: 16,
bidirectional) and Gemma 2 caps attention logits at 1, so the prompts (up to 200 tokens)
exercise both; each test that relies on a mechanism also shows that it changes the answer.
"""
from __future__ import annotations

import torch

import family_models as fm
import model_factory as mf
from vllm import LLM, PoolingParams

COS_MIN = 0.9999
PROB_TOL = 1e-4
BLOCK = 16


def _prompts(model_dir: str) -> list[str]:
    return mf.mixed_prompts(mf.hf_tokenizer(model_dir), lengths=(3, 200, 17, 64, 131))


def _last(model_dir: str, ids, **config) -> torch.Tensor:
    return fm.hf_hidden(model_dir, ids, **config)[-1]


def test_gemma2_embed_matches_eager_transformers(shared_llm, gemma2_embed_dir):
    llm = shared_llm(gemma2_embed_dir)
    cfg = llm.llm_engine.vllm_config
    assert cfg.cache_config.enable_prefix_caching  # causal + LAST: the gate is on
    assert cfg.scheduler_config.enable_chunked_prefill
    for out in llm.embed(_prompts(gemma2_embed_dir), use_tqdm=False):
        ref = _last(gemma2_embed_dir, out.prompt_token_ids)
        assert mf.cosine(out.outputs.embedding, ref) >= COS_MIN, len(out.prompt_token_ids)


def test_gemma2_softcap_and_window_matter(shared_llm, gemma2_embed_dir):
    """Dropping the softcap or the window gives a different answer, which the engine does
    not match: both mechanisms are really exercised."""
    llm = shared_llm(gemma2_embed_dir)
    prompt = mf.text_of_length(mf.hf_tokenizer(gemma2_embed_dir), 80)
    out = llm.embed([prompt], use_tqdm=False)[0]
    ids = out.prompt_token_ids
    assert mf.cosine(out.outputs.embedding, _last(gemma2_embed_dir, ids)) >= COS_MIN
    for change in ({"attn_logit_softcapping": None}, {"sliding_window": 4096}):
        other = _last(gemma2_embed_dir, ids, **change)
        assert mf.cosine(out.outputs.embedding, other) < 0.999, change


def test_gemma2_cached_and_chunked_equal_reference(gemma2_embed_dir):
    """Prefix-cache readers and prefill chunks attend through the window and the softcap
    over keys read back from the cache."""
    llm = LLM(gemma2_embed_dir, block_size=BLOCK, max_num_batched_tokens=32)
    tok = mf.hf_tokenizer(gemma2_embed_dir)
    prefix = mf.text_of_length(tok, 70)
    prompts = [prefix + " red river", prefix + " blue house", prefix + " cat"]
    first = llm.embed(prompts[:1], use_tqdm=False)
    outs = first + llm.embed(prompts[1:], use_tqdm=False)
    assert outs[0].num_cached_tokens == 0
    assert all(o.num_cached_tokens >= 48 for o in outs[1:]), [o.num_cached_tokens for o in outs]
    for out in outs:
        ref = _last(gemma2_embed_dir, out.prompt_token_ids)
        assert mf.cosine(out.outputs.embedding, ref) >= COS_MIN


def test_gemma3_causal_embed_matches_transformers(shared_llm, gemma3_causal_dir):
    llm = shared_llm(gemma3_causal_dir)
    assert llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    for out in llm.embed(_prompts(gemma3_causal_dir), use_tqdm=False):
        ref = _last(gemma3_causal_dir, out.prompt_token_ids)
        assert mf.cosine(out.outputs.embedding, ref) >= COS_MIN


def test_gemma3_classifier_through_the_adapter(shared_llm, gemma3_cls_dir):
    llm = shared_llm(gemma3_cls_dir)
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.pooler_config.pooling_type == "LAST"
    assert cfg.cache_config.enable_prefix_caching
    for out in llm.classify(_prompts(gemma3_cls_dir), use_tqdm=False):
        ref = mf.probs_from_logits(fm.hf_logits(gemma3_cls_dir, out.prompt_token_ids))
        assert mf.max_abs_diff(out.outputs.probs, ref) <= PROB_TOL


def test_embeddinggemma_matches_sentence_transformers(shared_llm, embeddinggemma_dir):
    """Bidirectional Gemma 3 -> mean -> Dense -> Dense -> Normalize, as SentenceTransformer."""
    llm = shared_llm(embeddinggemma_dir)
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.pooler_config.pooling_type == "MEAN"
    assert not cfg.cache_config.enable_prefix_caching
    assert not cfg.scheduler_config.enable_chunked_prefill
    prompts = _prompts(embeddinggemma_dir)
    outs = llm.embed(prompts, use_tqdm=False)
    ref = mf.st_encode(embeddinggemma_dir, prompts)
    for out, r in zip(outs, ref):
        assert mf.cosine(out.outputs.embedding, r) >= COS_MIN, len(out.prompt_token_ids)


def test_embeddinggemma_mechanisms_matter(shared_llm, embeddinggemma_dir):
    """The Dense layers, bidirectional attention and the window each change the answer."""
    llm = shared_llm(embeddinggemma_dir)
    prompt = mf.text_of_length(mf.hf_tokenizer(embeddinggemma_dir), 90)
    out = llm.embed([prompt], use_tqdm=False)[0]
    ids = out.prompt_token_ids
    raw = llm.encode([prompt], use_tqdm=False)[0].outputs.data  # mean state, no Dense
    assert mf.cosine(raw, fm.hf_hidden(embeddinggemma_dir, ids).mean(0)) >= COS_MIN
    assert mf.cosine(out.outputs.embedding, raw) < 0.99
    hs = fm.hf_hidden(embeddinggemma_dir, ids).mean(0)
    for change in ({"use_bidirectional_attention": False}, {"sliding_window": 4096}):
        other = fm.hf_hidden(embeddinggemma_dir, ids, **change).mean(0)
        assert mf.cosine(hs, other) < 0.999, change
        assert mf.cosine(raw, other) < 0.999, change


def test_embeddinggemma_unnormalized(shared_llm, embeddinggemma_dir):
    llm = shared_llm(embeddinggemma_dir)
    out = llm.embed(["hello world"], pooling_params=PoolingParams(normalize=False),
                    use_tqdm=False)[0]
    assert abs(torch.tensor(out.outputs.embedding).norm().item() - 1.0) > 1e-3
