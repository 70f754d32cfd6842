"""MPNet served natively (all-mpnet-base-v2; upstream serves no MPNet): its relative
position bias added inside attention over the flat batch, equal to transformers and
sentence-transformers on tiny seeded checkpoints, with LoRA, and beside the Transformers
backend on the same checkpoint."""
from __future__ import annotations

import pathlib

import pytest
import torch

import model_factory as mf
import native_family_models as nf
from native_family_models import (ATOL, assert_native_encoder, check_embedding,
                                  check_probs, prompts_of)
from vllm import LLM


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("native_mpnet")


@pytest.fixture(scope="module")
def mpnet_st_dir(root) -> str:
    """all-mpnet-base-v2's layout: MPNetModel + [Transformer, Pooling MEAN, Normalize]."""
    return str(mf.write_st_files(nf.make_mpnet(root / "mpnet_st"), pooling="mean",
                                 normalize=True, max_seq_length=384))


@pytest.fixture(scope="module")
def mpnet_dir(root) -> str:
    return str(nf.make_mpnet(root / "mpnet", seed=nf.SEED + 10))


@pytest.fixture(scope="module")
def mpnet_cls_dir(root) -> str:
    return str(nf.make_mpnet(root / "mpnet_cls", cls="MPNetForSequenceClassification",
                             num_labels=3, seed=nf.SEED + 11))


@pytest.fixture(scope="module")
def mpnet_ce_dir(root) -> str:
    return str(nf.make_mpnet(root / "mpnet_ce", cls="MPNetForSequenceClassification",
                             num_labels=1, seed=nf.SEED + 12))


def test_mpnet_buckets_equal_transformers():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    from vllm.model_executor.models.mpnet import relative_buckets
    n = 400
    pos = torch.arange(n)
    ref = MPNetEncoder.relative_position_bucket(pos[None, :] - pos[:, None])
    assert torch.equal(relative_buckets(n, torch.device("cpu")), ref)


def test_mpnet_sentence_transformers_layout_equals_st(mpnet_st_dir):
    llm = LLM(mpnet_st_dir, dtype="float32")
    assert_native_encoder(llm, "MEAN")
    assert type(llm.llm_engine.runner.model.model).__name__ == "MPNetModel"
    prompts = prompts_of(mpnet_st_dir)
    outs = llm.embed(prompts, use_tqdm=False)
    for out, ref in zip(outs, mf.st_encode(mpnet_st_dir, prompts)):
        check_embedding(out.outputs.embedding, ref)
    for out in outs:  # and transformers' own MPNetModel, pooled by hand
        check_embedding(out.outputs.embedding,
                        mf.hf_embedding(mpnet_st_dir, out.prompt_token_ids, "MEAN"))


def test_mpnet_bare_checkpoint_pools_cls(mpnet_dir):
    """No sentence-transformers files: CLS, as every encoder `*Model` here (the last
    layer then computes only the pooled rows)."""
    llm = LLM(mpnet_dir, dtype="float32")
    assert_native_encoder(llm, "CLS")
    for out in llm.embed(prompts_of(mpnet_dir), use_tqdm=False):
        check_embedding(out.outputs.embedding,
                        mf.hf_embedding(mpnet_dir, out.prompt_token_ids, "CLS"))


def test_mpnet_position_limit_counts_the_padding_offset(mpnet_dir, monkeypatch):
    """514 position rows numbered from 2 hold 512 tokens: a full-length prompt runs, and
    one more position is refused at start-up instead of indexing past the table."""
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    with pytest.raises(ValueError, match="position limit"):
        LLM(mpnet_dir, dtype="float32", max_model_len=513)
    llm = LLM(mpnet_dir, dtype="float32", max_model_len=512)
    [out] = llm.embed([{"prompt_token_ids": [0] + [100] * 510 + [2]}], use_tqdm=False)
    check_embedding(out.outputs.embedding,
                    mf.hf_embedding(mpnet_dir, out.prompt_token_ids, "CLS"))


@pytest.mark.parametrize("alone_from,mask_bytes", [(1, None), (10 ** 9, None), (10 ** 9, 1)])
def test_mpnet_attention_layouts_give_the_same_numbers(mpnet_dir, monkeypatch, alone_from,
                                                        mask_bytes):
    """Every request alone, every group padded, and padded groups split down to one request
    per call (MAX_MASK_BYTES): the numbers of the default mix (long alone, short padded)."""
    from vllm.model_executor.models import mpnet
    llm = LLM(mpnet_dir, dtype="float32", pooler_config={"pooling_type": "MEAN"})
    prompts = prompts_of(mpnet_dir)
    default = llm.embed(prompts, use_tqdm=False)
    monkeypatch.setattr(mpnet, "ALONE_FROM", alone_from)
    if mask_bytes is not None:
        monkeypatch.setattr(mpnet, "MAX_MASK_BYTES", mask_bytes)
    for a, b in zip(default, llm.embed(prompts, use_tqdm=False)):
        assert mf.max_abs_diff(a.outputs.embedding, b.outputs.embedding) <= 1e-5


def test_mpnet_token_embed_equals_transformers(mpnet_dir):
    llm = LLM(mpnet_dir, dtype="float32", pooler_config={"task": "token_embed"})
    for out in llm.encode(prompts_of(mpnet_dir, (40, 7, 130)), use_tqdm=False):
        ref = mf.hf_hidden_states(mpnet_dir, out.prompt_token_ids)
        got = torch.as_tensor(out.outputs.data)
        assert got.shape == ref.shape
        for g, r in zip(got, ref):
            assert mf.cosine(g, torch.nn.functional.normalize(r, dim=-1)) >= 0.9999


def test_mpnet_native_equals_transformers_backend(mpnet_st_dir):
    prompts = prompts_of(mpnet_st_dir, (12, 90, 12, 3))
    native = LLM(mpnet_st_dir, dtype="float32").embed(prompts, use_tqdm=False)
    backend_llm = LLM(mpnet_st_dir, dtype="float32", model_impl="transformers")
    assert backend_llm.llm_engine.vllm_config.model_config.impl == "transformers"
    for a, b in zip(native, backend_llm.embed(prompts, use_tqdm=False)):
        check_embedding(a.outputs.embedding, b.outputs.embedding)


def test_mpnet_classifier_equals_transformers(mpnet_cls_dir):
    llm = LLM(mpnet_cls_dir, dtype="float32")
    assert_native_encoder(llm, "CLS")
    check_probs(llm.classify(prompts_of(mpnet_cls_dir), use_tqdm=False), mpnet_cls_dir)


def test_mpnet_cross_encoder_scores_pairs(mpnet_ce_dir):
    llm = LLM(mpnet_ce_dir, dtype="float32")
    tok = mf.hf_tokenizer(mpnet_ce_dir)
    query, docs = "what is a fox", ["the quick brown fox", "river water", "a lazy dog"]
    for doc, out in zip(docs, llm.score(query, docs, use_tqdm=False)):
        logits = mf.hf_seqcls_logits(mpnet_ce_dir, tok(query, doc)["input_ids"])
        assert abs(out.outputs.score - torch.sigmoid(logits).item()) <= ATOL


def test_mpnet_classifier_served_as_embedder(mpnet_cls_dir):
    llm = LLM(mpnet_cls_dir, dtype="float32", convert="embed")
    assert type(llm.llm_engine.runner.model.model).__name__ == "MPNetModel"
    for out in llm.embed(prompts_of(mpnet_cls_dir, (5, 50)), use_tqdm=False):
        check_embedding(out.outputs.embedding,
                        mf.hf_embedding(mpnet_cls_dir, out.prompt_token_ids, "CLS"))


def test_mpnet_lora_adapters_equal_peft(mpnet_dir, tmp_path):
    """PEFT adapters on MPNet's q/k/v (thirds of the fused projection), o and MLP, mixed
    with the base model in one step, equal PEFT's model and a hand merge."""
    import lora_factory as lf
    from vllm.lora.request import LoRARequest
    targets = ("q", "k", "v", "o", "intermediate.dense", "output.dense")
    loras = [LoRARequest(f"mp{i}", i + 1, lf.make_adapter(
        mpnet_dir, tmp_path / f"mp{i}", targets=targets, seed=i, r=4)) for i in range(2)]
    llm = LLM(mpnet_dir, dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=4)
    prompts = prompts_of(mpnet_dir, (3, 90, 17, 41))
    mix = [loras[0], None, loras[1], loras[0]]
    outs = llm.embed(prompts, lora_request=mix, use_tqdm=False)

    def cls(model, ids) -> torch.Tensor:
        return torch.nn.functional.normalize(lf.run(model, ids)[0], dim=-1)

    for out, lora in zip(outs, mix):
        models = [lf._load(mpnet_dir, "base")] if lora is None else \
            [m(mpnet_dir, lora.lora_path, "base") for m in (lf.peft_model, lf.merged_model)]
        for model in models:
            assert mf.max_abs_diff(out.outputs.embedding,
                                   cls(model, out.prompt_token_ids)) <= ATOL
    base = cls(lf._load(mpnet_dir, "base"), outs[0].prompt_token_ids)
    assert mf.max_abs_diff(outs[0].outputs.embedding, base) > 1e-3   # the adapter mattered


def test_mpnet_refuses_prefix_caching_loudly(mpnet_st_dir, vllm_log):
    llm = LLM(mpnet_st_dir, dtype="float32", enable_prefix_caching=True)
    assert not llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    assert any(r.levelname == "WARNING" and "Prefix caching" in r.getMessage()
               for r in vllm_log.records)
