"""Tiny seeded checkpoints of the newer families (ModernBERT, Gemma 2/3, DeBERTa-v2, SPLADE,
ColBERT) and their Transformers references (eager attention, one prompt at a time).

Same conventions as `model_factory`: hidden 64, a few layers, `torch.manual_seed`, seeded
noise on every parameter, float32 safetensors, a tokenizer beside the weights. Sliding
windows are small (8-16 tokens) so the test prompts (up to 200 tokens) run past them.
"""
from __future__ import annotations

import functools
import json
import pathlib
from typing import Callable, Optional, Sequence

import torch

import model_factory as mf

SEED = mf.SEED + 100


def _finish(model, path: pathlib.Path, tokenizer: str) -> pathlib.Path:
    mf._perturb(model)
    mf._save(model, path)
    if tokenizer == "bert":
        mf.save_bert_tokenizer(path, model_input_names=["input_ids", "attention_mask"])
    else:
        mf.save_bpe_tokenizer(path)
    return path


def make_modernbert(path, *, cls: str = "ModernBertModel", num_labels: Optional[int] = None,
                    pooling: str = "cls", seed: int = SEED, **config) -> pathlib.Path:
    """ModernBERT: 3 layers (global, local, local), local_attention 16 (8 each side)."""
    import transformers
    path = mf._fresh(path)
    kw = dict(vocab_size=mf.BERT_VOCAB, hidden_size=64, intermediate_size=96,
              num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=512,
              global_attn_every_n_layers=3, local_attention=16, pad_token_id=0,
              bos_token_id=101, cls_token_id=101, eos_token_id=102, sep_token_id=102,
              classifier_pooling=pooling, norm_bias=True, attention_bias=True, mlp_bias=True,
              classifier_bias=True)
    if num_labels is not None:
        kw["num_labels"] = num_labels
    kw.update(config)
    cfg = transformers.ModernBertConfig(**kw)
    torch.manual_seed(seed)
    return _finish(getattr(transformers, cls)(cfg), path, "bert")


def _gemma_config(family: str, **overrides):
    import transformers
    eos = mf.bpe_token_id(mf.BPE_EOS)
    kw = dict(vocab_size=mf.BPE_VOCAB, hidden_size=64, intermediate_size=128,
              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=512, rms_norm_eps=1e-6, sliding_window=12,
              query_pre_attn_scalar=24, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
              hidden_activation="gelu_pytorch_tanh", attn_implementation="eager")
    if family == "gemma2":
        kw.update(attn_logit_softcapping=1.0, final_logit_softcapping=30.0,
                  query_pre_attn_scalar=4)
        cfg_cls = transformers.Gemma2Config
    else:
        kw.update(rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
            layer_types=["sliding_attention", "full_attention", "sliding_attention",
                         "full_attention"])
        cfg_cls = transformers.Gemma3TextConfig
    kw.update(overrides)
    return cfg_cls(**kw)


def make_gemma(path, family: str, *, cls: str, num_labels: Optional[int] = None,
               seed: int = SEED + 1, **overrides) -> pathlib.Path:
    """Gemma2 (attention softcap 1.0, window 12 on alternate layers) or Gemma3 text (QK-norm,
    per-layer-type rope, window 12); `cls` is the Transformers class to save."""
    import transformers
    path = mf._fresh(path)
    if num_labels is not None:
        overrides["num_labels"] = num_labels
    cfg = _gemma_config(family, **overrides)
    torch.manual_seed(seed)
    return _finish(getattr(transformers, cls)(cfg), path, "bpe")


def make_embeddinggemma(path, seed: int = SEED + 2) -> pathlib.Path:
    """EmbeddingGemma layout: Gemma3TextModel with use_bidirectional_attention, and
    sentence-transformers [Transformer, Pooling mean, Dense 64->96, Dense 96->64, Normalize]
    (both Dense without bias and with Identity activation, as the real model)."""
    path = make_gemma(path, "gemma3", cls="Gemma3TextModel", seed=seed,
                      use_bidirectional_attention=True, sliding_window=16)
    mf.write_st_files(path, pooling="mean", normalize=False)
    modules = json.loads((path / "modules.json").read_text())
    gen = torch.Generator().manual_seed(seed)
    for d_in, d_out in ((64, 96), (96, 64)):
        idx = len(modules)
        rel = f"{idx}_Dense"
        (path / rel).mkdir()
        (path / rel / "config.json").write_text(json.dumps({
            "in_features": d_in, "out_features": d_out, "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity"}))
        from safetensors.torch import save_file
        weight = torch.randn(d_out, d_in, generator=gen) / d_in ** 0.5
        save_file({"linear.weight": weight.contiguous()}, str(path / rel / "model.safetensors"))
        modules.append({"idx": idx, "name": str(idx), "path": rel, "type": mf.ST_DENSE})
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": "3_Normalize",
                    "type": mf.ST_NORMALIZE})
    (path / "3_Normalize").mkdir(exist_ok=True)
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    return path


def make_deberta(path, *, num_labels: int = 1, v3: bool = True,
                 seed: int = SEED + 3) -> pathlib.Path:
    """DebertaV2ForSequenceClassification. v3: shared attention keys, no absolute positions,
    16 log buckets (exact distances only within +-8, so long pairs reach the log range);
    v3=False: separate pos_key/pos_query projections, absolute positions, 64 plain
    relative positions."""
    import transformers
    path = mf._fresh(path)
    kw = dict(vocab_size=mf.BERT_VOCAB, hidden_size=64, num_hidden_layers=2,
              num_attention_heads=4, intermediate_size=128, max_position_embeddings=512,
              relative_attention=True, pos_att_type=["p2c", "c2p"], pooler_hidden_size=64,
              pooler_hidden_act="gelu", hidden_act="gelu", pooler_dropout=0.0,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0,
              num_labels=num_labels, type_vocab_size=0)
    if v3:
        kw.update(position_buckets=16, max_relative_positions=-1, norm_rel_ebd="layer_norm",
                  share_att_key=True, position_biased_input=False)
    else:
        kw.update(max_relative_positions=64, share_att_key=False, position_biased_input=True)
    torch.manual_seed(seed)
    model = transformers.DebertaV2ForSequenceClassification(
        transformers.DebertaV2Config(**kw))
    return _finish(model, path, "bert")


def make_splade(path, *, sparse_encoder: bool = False, seed: int = SEED + 5) -> pathlib.Path:
    """BertForMaskedLM (tied decoder, so no decoder weight is saved). sparse_encoder=False:
    config.json names BertSpladeSparseEmbeddingModel; True: saved by sentence-transformers'
    SparseEncoder [MLMTransformer, SpladePooling max] (config.json keeps BertForMaskedLM)."""
    import transformers
    path = mf._fresh(path)
    torch.manual_seed(seed)
    model = transformers.BertForMaskedLM(transformers.BertConfig(**mf._bert_kwargs()))
    _finish(model, path, "bert")
    if not sparse_encoder:
        return mf.edit_config(path, architectures=["BertSpladeSparseEmbeddingModel"])
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
    src = path.with_name(path.name + "_src")
    path.rename(src)
    SparseEncoder(modules=[MLMTransformer(str(src)), SpladePooling("max")],
                  device="cpu").save(str(path))
    return path


def make_hf_colbert(path, seed: int = SEED + 7) -> pathlib.Path:
    """Stanford ColBERT's HF_ColBERT layout: `bert.*` + `linear.weight` [32, 64] (no bias),
    no dim in config.json (the weight's shape gives it)."""
    import transformers
    from safetensors.torch import load_file, save_file
    path = mf.make_bert(path, seed=seed)
    tensors = {f"bert.{k}": v for k, v in load_file(str(path / "model.safetensors")).items()}
    gen = torch.Generator().manual_seed(seed)
    tensors["linear.weight"] = torch.randn(32, 64, generator=gen) / 8
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    assert isinstance(transformers.AutoConfig.from_pretrained(str(path)),
                      transformers.BertConfig)
    return mf.edit_config(path, architectures=["HF_ColBERT"])


def make_modern_colbert(path, seed: int = SEED + 8) -> pathlib.Path:
    """PyLate layout (GTE-ModernColBERT): a ModernBertModel checkpoint + sentence-transformers
    [Transformer, Dense 64->24 without bias, Identity]; config.json says ModernBertModel."""
    from safetensors.torch import save_file
    path = make_modernbert(path, seed=seed)
    (path / "1_Dense").mkdir()
    (path / "1_Dense" / "config.json").write_text(json.dumps({
        "in_features": 64, "out_features": 24, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity"}))
    gen = torch.Generator().manual_seed(seed)
    save_file({"linear.weight": (torch.randn(24, 64, generator=gen) / 8).contiguous()},
              str(path / "1_Dense" / "model.safetensors"))
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": mf.ST_TRANSFORMER},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": mf.ST_DENSE}]))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512}))
    return path


def colbert_reference(path, ids: Sequence[int], weight: torch.Tensor) -> torch.Tensor:
    """Per-token L2-normalised projections of the final hidden states [n, dim]."""
    hidden = hf_hidden(path, ids)
    return torch.nn.functional.normalize(hidden @ weight.T, dim=-1)


def splade_reference(path, ids: Sequence[int]) -> torch.Tensor:
    """max over tokens of log(1 + relu(MLM logits)), from BertForMaskedLM."""
    with torch.inference_mode():
        logits = hf_model(str(path), "mlm")(input_ids=torch.tensor([list(ids)])).logits[0]
    return torch.log1p(torch.relu(logits.float())).amax(0)


# --------------------------------------------------------------------------- references

@functools.lru_cache(maxsize=None)
def hf_model(path: str, kind: str = "base", **config):
    """A Transformers model in float32, eager attention; `config` edits its config."""
    import transformers
    cls = {"base": transformers.AutoModel,
           "seqcls": transformers.AutoModelForSequenceClassification,
           "causal": transformers.AutoModelForCausalLM,
           "mlm": transformers.AutoModelForMaskedLM}[kind]
    cfg = transformers.AutoConfig.from_pretrained(path)
    for k, v in config.items():
        setattr(cfg, k, v)
    cfg._attn_implementation = "eager"
    return cls.from_pretrained(path, config=cfg, dtype=torch.float32).eval()


def hf_hidden(path, ids: Sequence[int], **config) -> torch.Tensor:
    with torch.inference_mode():
        out = hf_model(str(path), "base", **config)(input_ids=torch.tensor([list(ids)]))
    return out.last_hidden_state[0].float()


def hf_logits(path, ids: Sequence[int], **config) -> torch.Tensor:
    with torch.inference_mode():
        out = hf_model(str(path), "seqcls", **config)(input_ids=torch.tensor([list(ids)]))
    return out.logits[0].float()


CHECKPOINTS: dict[str, tuple[str, Callable[[pathlib.Path], pathlib.Path]]] = {
    "modernbert_embed_dir": (
        "ModernBertModel (3 layers: global, local, local; local_attention 16)",
        lambda p: make_modernbert(p)),
    "modernbert_cls_dir": (
        "ModernBertForSequenceClassification, classifier_pooling cls, num_labels 1",
        lambda p: make_modernbert(p, cls="ModernBertForSequenceClassification", num_labels=1,
                                  seed=SEED + 10)),
    "modernbert_mean3_dir": (
        "ModernBertForSequenceClassification, classifier_pooling mean, num_labels 3",
        lambda p: make_modernbert(p, cls="ModernBertForSequenceClassification", num_labels=3,
                                  pooling="mean", seed=SEED + 11)),
    "gemma2_embed_dir": (
        "Gemma2ForCausalLM (4 layers, window 12 on alternate layers, attention softcap 1)",
        lambda p: make_gemma(p, "gemma2", cls="Gemma2ForCausalLM", seed=SEED + 12)),
    "gemma3_causal_dir": (
        "Gemma3ForCausalLM (4 layers, QK-norm, window 12 on layers 0 and 2)",
        lambda p: make_gemma(p, "gemma3", cls="Gemma3ForCausalLM", seed=SEED + 13)),
    "gemma3_cls_dir": (
        "Gemma3TextForSequenceClassification, num_labels 2",
        lambda p: make_gemma(p, "gemma3", cls="Gemma3TextForSequenceClassification",
                             num_labels=2, seed=SEED + 14)),
    "deberta_ce_dir": (
        "DeBERTa-v3-style cross-encoder (1 label, 16 log position buckets, shared keys)",
        lambda p: make_deberta(p)),
    "deberta_nli_dir": (
        "DeBERTa-v2-style classifier (3 labels, separate position projections, abs. positions)",
        lambda p: make_deberta(p, num_labels=3, v3=False, seed=SEED + 4)),
    "splade_dir": (
        "BertForMaskedLM with architectures [BertSpladeSparseEmbeddingModel], tied decoder",
        lambda p: make_splade(p)),
    "splade_st_dir": (
        "sentence-transformers SparseEncoder: MLMTransformer (BertForMaskedLM) + SpladePooling",
        lambda p: make_splade(p, sparse_encoder=True, seed=SEED + 6)),
    "hf_colbert_dir": (
        "HF_ColBERT: BERT (bert.* names) + linear 64->32, dim from the weight's shape",
        lambda p: make_hf_colbert(p)),
    "modern_colbert_dir": (
        "PyLate-style ModernBERT ColBERT: ModernBertModel + ST 1_Dense 64->24",
        lambda p: make_modern_colbert(p)),
    "embeddinggemma_dir": (
        "EmbeddingGemma layout: bidirectional Gemma3TextModel + ST mean, Dense, Dense, Normalize",
        lambda p: make_embeddinggemma(p)),
}
