"""Tied weights stored under either name (issue 28 item 3): `tied_weights` on the model
class, resolved by `model_loader._tie_plan` as Transformers' `tie_weights` does on load.

Each checkpoint is a tiny one rewritten after `save_pretrained`, and each engine output is
checked against Transformers loading the same rewritten files.
"""
from __future__ import annotations

import pathlib

import pytest
import torch
from safetensors.torch import load_file, save_file

import family_models as fm
import model_factory as mf
from vllm import LLM

TOL = 1e-4
_BIAS, _DEC_BIAS = "cls.predictions.bias", "cls.predictions.decoder.bias"
_WORDS, _DEC_WEIGHT = "bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"


def _rewrite(src, dst, edit, **config) -> str:
    """Copy the checkpoint `src` to `dst`; `edit(tensors)` rewrites its safetensors in place."""
    path = mf.copy_checkpoint(src, dst, **config)
    file = pathlib.Path(path) / "model.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file), metadata={"format": "pt"})
    return str(path)


# ------------------------------------------------------------------ SPLADE (BertForMaskedLM)

def _bias(seed: int) -> torch.Tensor:
    return torch.randn(mf.BERT_VOCAB, generator=torch.Generator().manual_seed(seed))


def _splade_layout(name: str):
    """How the checkpoint stores the decoder bias (a fresh random one, std 1, so that a
    wrong or missing bias shows) and the decoder weight."""
    new, other = _bias(1), _bias(2)

    def edit(t: dict) -> None:
        del t[_BIAS]
        if name in ("bias", "both_equal"):
            t[_BIAS] = new.clone()
        if name in ("decoder_bias", "both_equal", "aliases_only"):
            t[_DEC_BIAS] = new.clone()
        if name == "both_differ":  # Transformers leaves them untied: the decoder's own wins
            t[_BIAS], t[_DEC_BIAS] = other, new.clone()
        if name == "aliases_only":  # the word embeddings stored as the decoder weight
            t[_DEC_WEIGHT] = t.pop(_WORDS)
    return edit


SPLADE_LAYOUTS = ["bias", "decoder_bias", "both_equal", "both_differ", "aliases_only"]


@pytest.fixture(scope="module")
def splade_layout_dir(models_root, splade_dir):
    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            built[name] = _rewrite(splade_dir, models_root / f"splade_tied_{name}",
                                   _splade_layout(name))
        return built[name]
    return get


@pytest.mark.parametrize("layout", SPLADE_LAYOUTS)
def test_splade_tied_bias_and_decoder_under_either_name(splade_layout_dir, splade_dir, layout):
    path = splade_layout_dir(layout)
    names = set(load_file(str(pathlib.Path(path) / "model.safetensors")))
    assert (_DEC_BIAS in names) == (layout != "bias")
    llm = LLM(model=path)
    texts = mf.mixed_prompts(mf.hf_tokenizer(path), lengths=(3, 40))
    for out in llm.embed(texts, use_tqdm=False):
        ref = fm.splade_reference(path, out.prompt_token_ids)
        # the rewritten bias matters: the original checkpoint's output is far away
        assert mf.max_abs_diff(fm.splade_reference(splade_dir, out.prompt_token_ids),
                               ref) > 100 * TOL
        assert mf.max_abs_diff(torch.tensor(out.outputs.embedding), ref) <= TOL


# ------------------------------------------------------------------ causal LM (lm_head)

RERANKER = {"architectures": ["Qwen3ForSequenceClassification"],
            "classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": True}


def _lm_head_only(t: dict) -> None:
    t["lm_head.weight"] = t.pop("model.embed_tokens.weight")


def _p_yes(path: str, ids: list[int]) -> float:
    tok = mf.hf_tokenizer(path)
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    return torch.softmax(mf.hf_lm_logits(path, ids)[[no, yes]], dim=-1)[1].item()


def test_causal_lm_checkpoint_holding_only_lm_head(models_root, qwen3_reranker_dir):
    """tie_word_embeddings and only `lm_head.weight` stored: Transformers takes the input
    embeddings from it; the reranker's score rows come from it too."""
    path = _rewrite(qwen3_reranker_dir, models_root / "qwen3_lm_head_only", _lm_head_only)
    llm = LLM(model=path, hf_overrides=RERANKER)
    texts = mf.mixed_prompts(mf.hf_tokenizer(path), lengths=(3, 40))
    for text, out in zip(texts, llm.classify(texts, use_tqdm=False)):
        ids = list(mf.hf_tokenizer(path)(text)["input_ids"])
        assert abs(out.outputs.probs[0] - _p_yes(path, ids)) <= 1e-5


# ------------------------------------------------------------------ tie_word_embeddings: false

def test_untied_config_does_not_fill_missing_weights(models_root, splade_dir,
                                                     qwen3_reranker_dir):
    """Transformers ties nothing without tie_word_embeddings (it would initialise the
    missing weight at random): the engine refuses instead of guessing."""
    untied = {"tie_word_embeddings": False}
    path = mf.copy_checkpoint(splade_dir, models_root / "splade_untied", **untied)
    with pytest.raises(ValueError, match="missing weights.*cls.predictions.decoder"):
        LLM(model=str(path))
    path = _rewrite(qwen3_reranker_dir, models_root / "qwen3_untied_lm_head_only",
                    _lm_head_only, **untied)
    with pytest.raises(ValueError, match="missing weights.*embed_tokens"):
        LLM(model=path)
    path = mf.copy_checkpoint(qwen3_reranker_dir, models_root / "qwen3_untied", **untied)
    with pytest.raises(ValueError, match="needs the checkpoint's lm_head"):
        LLM(model=str(path), hf_overrides=RERANKER)
