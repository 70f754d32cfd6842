"""ModernBERT (embedder and classifiers) through `LLM` equals Transformers (eager), float32.

The tiny model alternates global and local attention (local_attention 16: 8 tokens each
side); the prompts run to 200 tokens, so the window cuts most keys of the local layers.
"""
from __future__ import annotations

import pytest
import torch

import family_models as fm
import model_factory as mf

COS_MIN = 0.9999
PROB_TOL = 1e-4


def _prompts(model_dir: str) -> list[str]:
    return mf.mixed_prompts(mf.hf_tokenizer(model_dir))


def test_modernbert_embed_matches_transformers(shared_llm, modernbert_embed_dir):
    llm = shared_llm(modernbert_embed_dir)
    prompts = _prompts(modernbert_embed_dir)
    outs = llm.embed(prompts, use_tqdm=False)
    assert max(len(o.prompt_token_ids) for o in outs) > 100  # far past the 8-token window
    for out in outs:
        ref = fm.hf_hidden(modernbert_embed_dir, out.prompt_token_ids)[0]  # CLS
        assert mf.cosine(out.outputs.embedding, ref) >= COS_MIN, len(out.prompt_token_ids)


def test_modernbert_window_matters(shared_llm, modernbert_embed_dir):
    """Without the local window (all layers global) the long prompt's embedding differs:
    the parity above really exercises the window."""
    llm = shared_llm(modernbert_embed_dir)
    prompt = mf.text_of_length(mf.hf_tokenizer(modernbert_embed_dir), 120)
    out = llm.embed([prompt], use_tqdm=False)[0]
    ids = out.prompt_token_ids
    windowed = fm.hf_hidden(modernbert_embed_dir, ids)[0]
    global_only = fm.hf_hidden(modernbert_embed_dir, ids, local_attention=4096)[0]
    assert mf.cosine(windowed, global_only) < 0.999
    assert mf.cosine(out.outputs.embedding, windowed) >= COS_MIN
    assert mf.cosine(out.outputs.embedding, global_only) < 0.999


def test_modernbert_gate_off(shared_llm, modernbert_embed_dir):
    cfg = shared_llm(modernbert_embed_dir).llm_engine.vllm_config
    assert not cfg.cache_config.enable_prefix_caching
    assert not cfg.scheduler_config.enable_chunked_prefill


@pytest.mark.parametrize("fixture,pooling", [("modernbert_cls_dir", "CLS"),
                                             ("modernbert_mean3_dir", "MEAN")])
def test_modernbert_classifier_matches_transformers(request, shared_llm, fixture, pooling):
    model_dir = request.getfixturevalue(fixture)
    llm = shared_llm(model_dir)
    assert llm.llm_engine.model_config.pooler_config.pooling_type == pooling
    outs = llm.classify(_prompts(model_dir), use_tqdm=False)
    for out in outs:
        ref = mf.probs_from_logits(fm.hf_logits(model_dir, out.prompt_token_ids))
        assert mf.max_abs_diff(out.outputs.probs, ref) <= PROB_TOL


def test_modernbert_cross_encoder_score(shared_llm, modernbert_cls_dir):
    """A one-label ModernBERT classifier scores pairs: sigmoid of its logit on the pair."""
    llm = shared_llm(modernbert_cls_dir)
    tok = mf.hf_tokenizer(modernbert_cls_dir)
    query, docs = "what is a river", ["a river is water", mf.text_of_length(tok, 150)]
    outs = llm.score(query, docs, use_tqdm=False)
    for doc, out in zip(docs, outs):
        ids = tok(query, doc)["input_ids"]
        ref = torch.sigmoid(fm.hf_logits(modernbert_cls_dir, ids))[0]
        assert abs(out.outputs.score - float(ref)) <= PROB_TOL
