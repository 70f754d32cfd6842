"""Tiny seeded checkpoints for the natively served families of issue 36 (MPNet, the masked-LM
encoders served as embedders, bidirectional Llama), built as `model_factory` builds its own:
hidden 64, 2 layers, `torch.manual_seed`, seeded noise on every parameter, float32
safetensors, MiniLM's BERT tokenizer beside the weights (no token_type_ids).
"""
from __future__ import annotations

import pathlib
from typing import Optional

import torch

import model_factory as mf

ATOL = 1e-4
# Short and long (past MPNet's exact buckets and its 128 max distance), unsorted, plus two
# of one length (a batched group without padding).
LENGTHS = (3, 200, 17, 64, 5, 131, 9, 33, 17)

SEED = mf.SEED + 300
SMALL = dict(vocab_size=mf.BERT_VOCAB, hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4, intermediate_size=128, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0)


def _finish(model, path: pathlib.Path) -> pathlib.Path:
    mf._perturb(model)
    mf._save(model, path)
    mf.save_bert_tokenizer(path, model_input_names=["input_ids", "attention_mask"])
    return path


def make_mpnet(path, *, cls: str = "MPNetModel", num_labels: Optional[int] = None,
               seed: int = SEED, **config) -> pathlib.Path:
    """MPNet (514 positions, numbered from 2, as all-mpnet-base-v2; 32 relative buckets)."""
    import transformers
    path = mf._fresh(path)
    kw = dict(SMALL, max_position_embeddings=514, pad_token_id=1, bos_token_id=0,
              eos_token_id=2)
    if num_labels is not None:
        kw["num_labels"] = num_labels
    kw.update(config)
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(transformers.MPNetConfig(**kw))
    with torch.no_grad():  # a bias table that matters: scores differ by whole units
        for name, p in model.named_parameters():
            if name.endswith("relative_attention_bias.weight"):
                p.normal_(0.0, 3.0)
    return _finish(model, path)


def make_masked_lm(path, family: str, *, seed: int = SEED + 1) -> pathlib.Path:
    """BertForMaskedLM / RobertaForMaskedLM (tied decoder, as the hub's checkpoints)."""
    import transformers
    path = mf._fresh(path)
    if family == "bert":
        cfg = transformers.BertConfig(**mf._bert_kwargs())
        cls = transformers.BertForMaskedLM
    else:
        cfg = transformers.RobertaConfig(**mf._bert_kwargs(
            pad_token_id=1, bos_token_id=0, eos_token_id=2, max_position_embeddings=514,
            type_vocab_size=1))
        cls = transformers.RobertaForMaskedLM
    torch.manual_seed(seed)
    model = cls(cfg)
    path = _finish(model, path)
    if family == "bert":  # BERT's tokenizer emits segment ids; keep them as the hub's do
        mf.save_bert_tokenizer(path)
    return path


def make_llama_bidirectional(path, *, cls: str = "LlamaBidirectionalModel",
                             num_labels: Optional[int] = None, pooling: str = "avg",
                             seed: int = SEED + 2) -> pathlib.Path:
    """llama-nemotron-embed / nemotron-rerank layout: a Llama checkpoint (`model.*` without
    prefix for the embedder, `model.*` + `score.*` for the reranker) whose config names
    the bidirectional class and its `pooling`; weights saved from transformers' Llama
    (no token_type_ids, as Llama tokenizers)."""
    import transformers
    path = mf._fresh(path)
    overrides = {} if num_labels is None else {"num_labels": num_labels}
    cfg = mf._decoder_config("llama", **overrides)
    torch.manual_seed(seed)
    model = (transformers.LlamaModel(cfg) if num_labels is None else
             transformers.LlamaForSequenceClassification(cfg))
    _finish(model, path)
    # The hub's config.json says model_type "llama_bidirec" (its config class ships with
    # the checkpoint); "llama" lets transformers read it without remote code. No
    # `is_causal` key: the architecture name alone must make it bidirectional.
    mf.edit_config(path, architectures=[cls], pooling=pooling)
    return path


# ------------------------------------------------------------------ checks

def prompts_of(path: str, lengths=LENGTHS) -> list[str]:
    return mf.mixed_prompts(mf.hf_tokenizer(path), lengths)


def check_embedding(got, ref) -> None:
    got, ref = torch.as_tensor(got, dtype=torch.float32), torch.as_tensor(ref).float()
    assert mf.cosine(got, ref) >= 0.9999
    assert abs(got.norm().item() / ref.norm().item() - 1) <= 1e-3


def check_probs(outs, path: str) -> None:
    for out in outs:
        ref = mf.probs_from_logits(mf.hf_seqcls_logits(path, out.prompt_token_ids))
        assert mf.max_abs_diff(torch.tensor(out.outputs.probs), ref) <= ATOL


def assert_native_encoder(llm, pooling: str) -> None:
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.impl == "vllm"
    assert cfg.model_config.pooler_config.pooling_type == pooling
    assert not cfg.cache_config.enable_prefix_caching
    assert not cfg.scheduler_config.enable_chunked_prefill
