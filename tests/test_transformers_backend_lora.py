"""LoRA adapters on the Transformers backend (issue 36 item 1): PEFT adapters built in the
test on the transformers model's nn.Linear projections, per request, mixed in one step with
the base model, equal to PEFT: a causal decoder forced onto the backend (flat step, prefix
caching keyed by the adapter; also equal to the native implementation), an encoder
classifier only the backend serves (an adapter with its own classifier), an encoder that
runs whole sequences (padded rows mapped to their request's adapter), and a refusal."""
from __future__ import annotations

import pathlib

import pytest
import torch

import lora_factory as lf
import model_factory as mf
from test_lora import BERT, DECODER
from test_transformers_backend import _check_embeddings, _tiny_encoder
from test_transformers_backend_heads import _SMALL, _decoder, _encoder
from vllm import LLM
from vllm.lora.request import LoRARequest

ATOL = 1e-4
MPNET = ("q", "v", "o", "intermediate.dense")
MIX = (0, None, 1, 0, 1, None)  # adapter index per prompt (None: the base model)


def _adapters(base: str, root: pathlib.Path, kind: str, targets, **kw) -> list[LoRARequest]:
    return [LoRARequest(f"ad{i}", i + 1, lf.make_adapter(
        base, root / f"ad{i}", kind=kind, targets=targets, seed=i, r=4 + 4 * i, alpha=8 + i,
        **kw)) for i in range(2)]


def _lora_llm(path: str, **kw) -> LLM:
    return LLM(path, dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=8, **kw)


def _peft(base: str, lora, kind: str, ids) -> torch.Tensor:
    model = lf._load(base, kind) if lora is None else lf.peft_model(base, lora.lora_path, kind)
    return lf.run(model, ids)


def _vec(out) -> torch.Tensor:
    return torch.tensor(out.outputs.embedding)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("transformers_lora")


def test_causal_backend_lora_equals_peft_native_and_caches_per_adapter(qwen3_embed_dir, root):
    base = qwen3_embed_dir
    adapters = _adapters(base, root / "qwen3", "base", DECODER)
    llm = _lora_llm(base, model_impl="transformers", block_size=16)
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.impl == "transformers" and cfg.cache_config.enable_prefix_caching
    tok = mf.hf_tokenizer(base)
    shared = mf.text_of_length(tok, 40, seed=3)
    prompts = [shared + " " + p for p in mf.mixed_prompts(tok, (3, 37, 17, 9, 25, 5))]
    loras = [None if i is None else adapters[i] for i in MIX]
    mixed = llm.embed(prompts, lora_request=loras, use_tqdm=False)
    for out, lora in zip(mixed, loras):
        ref = torch.nn.functional.normalize(_peft(base, lora, "base", out.prompt_token_ids)[-1],
                                            dim=-1)
        _check_embeddings(_vec(out), ref)
    plain = _peft(base, None, "base", mixed[0].prompt_token_ids)[-1]
    assert mf.cosine(_vec(mixed[0]), plain) < 0.999  # the adapter mattered
    layer = llm.llm_engine.runner.model.model.hf.layers[0]
    assert layer.self_attn.q_proj.lora is not None and layer.mlp.down_proj.lora is not None
    for lora in (None, *adapters):  # each alone, now from the prefix cache
        picked = [i for i, other in enumerate(loras) if other is lora]
        alone = llm.embed([prompts[i] for i in picked], lora_request=lora, use_tqdm=False)
        for i, out in zip(picked, alone):
            assert out.num_cached_tokens > 0
            assert mf.max_abs_diff(_vec(out), _vec(mixed[i])) <= ATOL
    fresh = mf.text_of_length(tok, 50, seed=9)
    counts = [llm.embed([fresh], lora_request=lora, use_tqdm=False)[0].num_cached_tokens
              for lora in (adapters[0], adapters[1], None, adapters[0])]
    assert counts[:3] == [0, 0, 0] and counts[3] > 0  # no block shared across adapters
    native = _lora_llm(base)
    assert native.llm_engine.vllm_config.model_config.impl == "vllm"
    for a, b in zip(mixed, native.embed(prompts, lora_request=loras, use_tqdm=False)):
        _check_embeddings(_vec(a), _vec(b))


@pytest.fixture(scope="module")
def electra_cls_dir(root) -> str:
    return _encoder(root, "electra_cls", "ElectraConfig", "ElectraForSequenceClassification",
                    31, True, **dict(_SMALL, embedding_size=32, num_labels=3,
                                     type_vocab_size=2, max_position_embeddings=256))


def test_encoder_classifier_lora_with_its_own_head_equals_peft(electra_cls_dir, root):
    """Electra (backend only): one adapter saves its own classifier; mixed = alone."""
    base = electra_cls_dir
    adapters = [LoRARequest("own-head", 1, lf.make_adapter(
        base, root / "electra0", kind="seqcls", targets=BERT, r=4, seed=0,
        modules_to_save=["classifier"])),
        LoRARequest("plain", 2, lf.make_adapter(base, root / "electra1", kind="seqcls",
                                                targets=BERT[:3], r=8, seed=1))]
    llm = _lora_llm(base)
    assert llm.llm_engine.vllm_config.model_config.impl == "transformers"
    prompts = mf.mixed_prompts(mf.hf_tokenizer(base), (3, 40, 17, 9, 25, 5))
    loras = [None if i is None else adapters[i] for i in MIX]
    mixed = llm.classify(prompts, lora_request=loras, use_tqdm=False)
    for out, lora in zip(mixed, loras):
        ref = mf.probs_from_logits(_peft(base, lora, "seqcls", out.prompt_token_ids))
        assert mf.max_abs_diff(torch.tensor(out.outputs.probs), ref) <= ATOL, lora
    plain = mf.probs_from_logits(_peft(base, None, "seqcls", mixed[0].prompt_token_ids))
    assert mf.max_abs_diff(mixed[0].outputs.probs, plain) > 1e-3  # the adapter mattered
    for lora in adapters:
        picked = [i for i, other in enumerate(loras) if other is lora]
        alone = llm.classify([prompts[i] for i in picked], lora_request=lora, use_tqdm=False)
        for i, out in zip(picked, alone):
            assert mf.max_abs_diff(out.outputs.probs, mixed[i].outputs.probs) <= 1e-5


def test_whole_sequence_backend_maps_padded_rows_to_their_adapter(root):
    """MPNet runs whole sequences (one padded batch): each row takes its request's adapter."""
    base = _tiny_encoder(root, "mpnet", "MPNetConfig", "MPNetModel", hidden_size=64,
                         intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=258)
    adapters = _adapters(base, root / "mpnet_ad", "base", MPNET)
    llm = _lora_llm(base, model_impl="transformers")
    assert llm.llm_engine.vllm_config.model_config.whole_sequences
    prompts = mf.mixed_prompts(mf.hf_tokenizer(base), (3, 40, 17, 9, 25, 5))
    loras = [None if i is None else adapters[i] for i in MIX]
    outs = llm.embed(prompts, lora_request=loras, use_tqdm=False)
    assert llm.llm_engine.stats.num_steps == 1  # one padded batch of base and adapter rows
    for out, lora in zip(outs, loras):
        hidden = _peft(base, lora, "base", out.prompt_token_ids)
        _check_embeddings(_vec(out), torch.nn.functional.normalize(hidden.mean(0), dim=-1))
    plain = _peft(base, None, "base", outs[0].prompt_token_ids).mean(0)
    assert mf.cosine(_vec(outs[0]), plain) < 0.999


def test_adapter_on_a_projection_the_backend_cannot_wrap_is_refused(root):
    """GPT-2's fused attention projection is a transformers Conv1D, not an nn.Linear."""
    path = _decoder(root, "gpt2", "GPT2Config", "GPT2Model", 32, n_embd=64, n_layer=1,
                    n_head=4, n_positions=256)
    adapter = LoRARequest("conv", 1, lf.make_adapter(
        path, root / "gpt2_ad", targets=("c_attn",), fan_in_fan_out=True))
    llm = _lora_llm(path)
    with pytest.raises(ValueError, match=r"'h\.0\.attn\.c_attn', a Conv1D .*nn\.Linear"):
        llm.embed(["hello world"], lora_request=adapter, use_tqdm=False)
    assert len(llm.embed(["hello world"], use_tqdm=False)[0].outputs.embedding) == 64
