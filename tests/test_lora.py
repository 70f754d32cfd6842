"""LoRA adapters on pooling models (issue 26 part A): exact against PEFT and a hand merge.

Every adapter is built at test time (`lora_factory.make_adapter`: seeded A and B, saved by
PEFT). References run one prompt at a time in float32: the PEFT model, and the base model
with W + (alpha / r) B @ A merged by hand. Batches mix the base model and several adapters
in one step, with fewer loaded-adapter slots than adapters, so slots are reused.
"""
from __future__ import annotations

import pytest
import torch

import lora_factory as lf
import model_factory as mf
from vllm import LLM
from vllm.lora.request import LoRARequest

ATOL = 1e-4
DECODER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BERT = ("query", "key", "value", "attention.output.dense", "intermediate.dense",
        "output.dense")
MODERNBERT = ("Wqkv", "Wo", "Wi")
# fixture, PEFT class the adapters were trained on, targets, pooling of the served model
EMBEDDERS = {
    "qwen2_embed_dir": ("causal", DECODER, "LAST"),
    "qwen3_embed_dir": ("base", DECODER, "LAST"),
    "llama_embed_dir": ("causal", ("q_proj", "v_proj", "down_proj"), "LAST"),
    "gemma2_embed_dir": ("causal", DECODER, "LAST"),
    "gemma3_causal_dir": ("base", DECODER, "LAST"),
    "bert_embed_dir": ("base", BERT, "CLS"),
    "roberta_embed_dir": ("base", BERT, "CLS"),
    "modernbert_embed_dir": ("base", MODERNBERT, "CLS"),
}


def _adapters(base: str, tmp_path, kind: str, targets, n: int = 3, **kw) -> list[LoRARequest]:
    return [LoRARequest(f"ad{i}", i + 1, lf.make_adapter(
        base, tmp_path / f"ad{i}", kind=kind, targets=targets, seed=i, r=4 + 2 * (i % 2),
        alpha=8 + i, use_rslora=i == 2, **kw)) for i in range(n)]


def _pooled(hidden: torch.Tensor, pooling: str) -> torch.Tensor:
    vec = hidden[-1] if pooling == "LAST" else hidden[0]
    return torch.nn.functional.normalize(vec, dim=-1)


def _references(base: str, adapter, kind: str, ids, pooling: str) -> list[torch.Tensor]:
    """[PEFT, hand-merged] embeddings (the base model twice when `adapter` is None)."""
    if adapter is None:
        return [_pooled(lf.run(lf._load(base, kind), ids), pooling)] * 2
    return [_pooled(lf.run(model(base, adapter.lora_path, kind), ids), pooling)
            for model in (lf.peft_model, lf.merged_model)]


def _mix(adapters: list[LoRARequest], n: int) -> list:
    """Adapters and the base interleaved: A, None, B, A, C, None, B, C, ..."""
    order = [0, None, 1, 0, 2, None, 1, 2]
    return [None if order[i % 8] is None else adapters[order[i % 8] % len(adapters)]
            for i in range(n)]


@pytest.mark.parametrize("fixture", list(EMBEDDERS))
def test_mixed_batch_of_adapters_equals_peft_and_hand_merge(fixture, request, tmp_path):
    """One engine step holds the base model and three adapters (ranks 4/6, one rsLoRA);
    every prompt equals both references; two slots for three adapters."""
    base = request.getfixturevalue(fixture)
    kind, targets, pooling = EMBEDDERS[fixture]
    adapters = _adapters(base, tmp_path, kind, targets)
    llm = LLM(base, enable_lora=True, max_loras=2, max_lora_rank=8)
    prompts = mf.mixed_prompts(mf.hf_tokenizer(base), lengths=(3, 90, 17, 64, 5, 33, 9, 41))
    loras = _mix(adapters, len(prompts))
    outs = llm.embed(prompts, lora_request=loras, use_tqdm=False)
    for out, lora in zip(outs, loras):
        got = torch.tensor(out.outputs.embedding)
        for ref in _references(base, lora, kind, out.prompt_token_ids, pooling):
            assert mf.max_abs_diff(got, ref) <= ATOL, (fixture, lora)
    base_only = _references(base, None, kind, outs[0].prompt_token_ids, pooling)[0]
    assert mf.max_abs_diff(outs[0].outputs.embedding, base_only) > 1e-3  # adapter mattered


@pytest.mark.parametrize("max_loras,max_cpu_loras", [(1, 1), (1, 3), (4, None)])
def test_any_slot_count_gives_the_same_numbers(qwen3_embed_dir, tmp_path, max_loras,
                                               max_cpu_loras):
    """Three adapters and the base in one batch, with 1, 1 (3 kept loaded) or 4 slots:
    adapters are dropped and reloaded as needed, the numbers never change."""
    adapters = _adapters(qwen3_embed_dir, tmp_path, "base", DECODER)
    llm = LLM(qwen3_embed_dir, enable_lora=True, max_loras=max_loras,
              max_cpu_loras=max_cpu_loras, max_lora_rank=8)
    prompts = mf.mixed_prompts(mf.hf_tokenizer(qwen3_embed_dir), lengths=(5, 40, 12, 70, 8))
    for _ in range(2):  # the second round reloads adapters evicted by the first
        loras = _mix(adapters, len(prompts))
        for out, lora in zip(llm.embed(prompts, lora_request=loras, use_tqdm=False), loras):
            ref = _references(qwen3_embed_dir, lora, "base", out.prompt_token_ids, "LAST")[0]
            assert mf.max_abs_diff(out.outputs.embedding, ref) <= ATOL
    assert len(llm.llm_engine.list_loras()) <= max(3, max_cpu_loras or max_loras)


def test_prefix_cache_keeps_adapters_apart(qwen3_embed_dir, tmp_path):
    """The same prompt under adapter A, adapter B and the base: three different answers,
    each its reference; B never hits A's blocks; a repeat under A reports cached tokens."""
    a, b = _adapters(qwen3_embed_dir, tmp_path, "base", DECODER, n=2)
    llm = LLM(qwen3_embed_dir, enable_lora=True, max_loras=2, max_lora_rank=8, block_size=16)
    assert llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    prompt = mf.text_of_length(mf.hf_tokenizer(qwen3_embed_dir), 70)
    got = {}
    for name, lora in (("a", a), ("b", b), ("base", None)):
        out = llm.embed([prompt], lora_request=lora, use_tqdm=False)[0]
        assert out.num_cached_tokens == 0, name
        ref = _references(qwen3_embed_dir, lora, "base", out.prompt_token_ids, "LAST")[0]
        assert mf.max_abs_diff(out.outputs.embedding, ref) <= ATOL, name
        got[name] = torch.tensor(out.outputs.embedding)
    assert min(mf.max_abs_diff(got[x], got[y]) for x, y in
               (("a", "b"), ("a", "base"), ("b", "base"))) > 1e-3
    again = llm.embed([prompt], lora_request=a, use_tqdm=False)[0]
    assert again.num_cached_tokens >= 64
    assert mf.max_abs_diff(again.outputs.embedding, got["a"]) <= ATOL


def test_chunked_prefill_under_adapters(qwen3_embed_dir, tmp_path):
    """Long prompts split over several steps (budget 32 tokens) under mixed adapters."""
    adapters = _adapters(qwen3_embed_dir, tmp_path, "base", DECODER, n=2)
    llm = LLM(qwen3_embed_dir, enable_lora=True, max_loras=2, max_lora_rank=8,
              max_num_batched_tokens=32, max_num_seqs=4)
    prompts = mf.mixed_prompts(mf.hf_tokenizer(qwen3_embed_dir), lengths=(70, 9, 55, 40))
    loras = [adapters[0], None, adapters[1], adapters[0]]
    for out, lora in zip(llm.embed(prompts, lora_request=loras, use_tqdm=False), loras):
        ref = _references(qwen3_embed_dir, lora, "base", out.prompt_token_ids, "LAST")[0]
        assert mf.max_abs_diff(out.outputs.embedding, ref) <= ATOL


def test_duplicates_are_shared_only_under_the_same_adapter(qwen3_embed_dir, tmp_path):
    a, b = _adapters(qwen3_embed_dir, tmp_path, "base", DECODER, n=2)
    llm = LLM(qwen3_embed_dir, enable_lora=True, max_loras=2, max_lora_rank=8)
    before = llm.llm_engine.stats.num_deduplicated
    outs = llm.embed(["hello world"] * 4, lora_request=[a, b, None, a], use_tqdm=False)
    assert llm.llm_engine.stats.num_deduplicated == before + 1  # only the second A
    vecs = [torch.tensor(o.outputs.embedding) for o in outs]
    assert mf.max_abs_diff(vecs[0], vecs[3]) == 0
    assert mf.max_abs_diff(vecs[0], vecs[1]) > 1e-3 and mf.max_abs_diff(vecs[0], vecs[2]) > 1e-3


def test_max_loras_bounds_the_adapters_of_one_step(qwen3_embed_dir, tmp_path):
    """max_loras=1: three adapters take three steps (the base joins the last); 3: one."""
    adapters = _adapters(qwen3_embed_dir, tmp_path, "base", DECODER)
    for max_loras, steps in ((1, 3), (3, 1)):
        llm = LLM(qwen3_embed_dir, enable_lora=True, max_loras=max_loras, max_lora_rank=8)
        before = llm.llm_engine.stats.num_steps
        llm.embed(["a b", "c d", "e f", "g h"], lora_request=adapters + [None], use_tqdm=False)
        assert llm.llm_engine.stats.num_steps - before == steps


@pytest.mark.parametrize("fixture", ["qwen3_embed_dir", "bert_embed_dir"])
def test_few_adapter_rows_among_many_base_rows(fixture, request, tmp_path):
    """Adapter rows a minority of the step: the LoRA term runs on those rows only, taken
    as one slice (a single adapter request) or gathered (requests apart in the layout)."""
    base = request.getfixturevalue(fixture)
    kind, targets, pooling = EMBEDDERS[fixture]
    a, b = _adapters(base, tmp_path, kind, targets, n=2)
    llm = LLM(base, enable_lora=True, max_loras=2, max_lora_rank=8)
    prompts = mf.mixed_prompts(mf.hf_tokenizer(base), lengths=(20, 90, 12, 80, 15, 70))
    for loras in ([a, None, b, None, None, None], [None, None, None, None, a, None]):
        for out, lora in zip(llm.embed(prompts, lora_request=loras, use_tqdm=False), loras):
            ref = _references(base, lora, kind, out.prompt_token_ids, pooling)[0]
            assert mf.max_abs_diff(out.outputs.embedding, ref) <= ATOL, (fixture, lora)


def test_rank_and_alpha_patterns_follow_peft(qwen3_embed_dir, tmp_path):
    """PEFT's per-module rank_pattern / alpha_pattern (rank 2 on v_proj, alpha 3 on
    q_proj) give the scaling PEFT uses."""
    path = lf.make_adapter(qwen3_embed_dir, tmp_path / "pat", targets=DECODER, r=4,
                           rank_pattern={"v_proj": 2}, alpha_pattern={"q_proj": 3.0})
    lora = LoRARequest("pat", 1, path)
    llm = LLM(qwen3_embed_dir, enable_lora=True, max_lora_rank=8)
    out = llm.embed(["hello world the quick brown fox"], lora_request=lora, use_tqdm=False)[0]
    peft = _pooled(lf.run(lf.peft_model(qwen3_embed_dir, path, "base"), out.prompt_token_ids),
                   "LAST")
    assert mf.max_abs_diff(out.outputs.embedding, peft) <= ATOL


def test_embedding_score_and_encode_take_the_adapter(qwen3_embed_dir, tmp_path):
    """score on an embedding model: the cosine of the two embeddings under the adapter;
    encode('embed') under the adapter equals embed."""
    (a,) = _adapters(qwen3_embed_dir, tmp_path, "base", DECODER, n=1)
    llm = LLM(qwen3_embed_dir, enable_lora=True, max_lora_rank=8)
    q, docs = "which city is large", ["paris london", "water is blue"]
    vecs = llm.embed([q] + docs, lora_request=a, use_tqdm=False)
    base = llm.score(q, docs, use_tqdm=False)
    for i, out in enumerate(llm.score(q, docs, lora_request=a, use_tqdm=False)):
        want = mf.cosine(vecs[0].outputs.embedding, vecs[i + 1].outputs.embedding)
        assert out.outputs.score == pytest.approx(want, abs=1e-5)
        assert abs(out.outputs.score - base[i].outputs.score) > 1e-4
    enc = llm.encode([q], pooling_task="embed", lora_request=[a], use_tqdm=False)[0]
    assert mf.max_abs_diff(enc.outputs.data, vecs[0].outputs.embedding) <= 1e-6


def test_an_id_reloaded_in_place_keeps_earlier_requests_on_their_weights(qwen3_embed_dir,
                                                                          tmp_path):
    """Id 1 from adapter A, then (same call, same step) id 1 reloaded in place from B:
    each prompt runs the weights it was queued under; then id 1 serves B."""
    a, b = _adapters(qwen3_embed_dir, tmp_path, "base", DECODER, n=2)
    first = LoRARequest("t", 1, a.lora_path)
    second = LoRARequest("t", 1, b.lora_path, load_inplace=True)
    llm = LLM(qwen3_embed_dir, enable_lora=True, max_loras=2, max_lora_rank=8)
    outs = llm.embed(["hello world", "hello world"], lora_request=[first, second],
                     use_tqdm=False)
    for out, lora in zip(outs, (a, b)):
        ref = _references(qwen3_embed_dir, lora, "base", out.prompt_token_ids, "LAST")[0]
        assert mf.max_abs_diff(out.outputs.embedding, ref) <= ATOL
    later = llm.embed(["hello world"], lora_request=LoRARequest("t", 1, b.lora_path),
                      use_tqdm=False)[0]
    assert mf.max_abs_diff(later.outputs.embedding, outs[1].outputs.embedding) == 0
    assert llm.llm_engine.remove_lora(1) and llm.llm_engine.list_loras() == set()


def test_mean_pooling_with_caching_asked_for_under_adapters(qwen3_embed_dir, tmp_path):
    """A causal model with MEAN pooling and prefix caching + chunked prefill asked for
    (the pooler's payload cached with the blocks) under adapters: exact, and a repeat
    under the same adapter reads the cache."""
    a, b = _adapters(qwen3_embed_dir, tmp_path, "base", DECODER, n=2)
    llm = LLM(qwen3_embed_dir, enable_lora=True, max_loras=2, max_lora_rank=8,
              override_pooler_config={"pooling_type": "MEAN"}, enable_prefix_caching=True,
              enable_chunked_prefill=True, max_num_batched_tokens=32)
    prompts = mf.mixed_prompts(mf.hf_tokenizer(qwen3_embed_dir), lengths=(70, 9, 50))
    for _ in range(2):
        outs = llm.embed(prompts, lora_request=[a, None, b], use_tqdm=False)
        for out, lora in zip(outs, (a, None, b)):
            model = lf.peft_model(qwen3_embed_dir, lora.lora_path, "base") if lora else \
                lf._load(qwen3_embed_dir, "base")
            ref = torch.nn.functional.normalize(lf.run(model, out.prompt_token_ids).mean(0),
                                                dim=-1)
            assert mf.max_abs_diff(out.outputs.embedding, ref) <= ATOL
    assert outs[0].num_cached_tokens >= 64
