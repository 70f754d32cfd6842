"""Every model family through the public `LLM` API equals Transformers in float32.

Batches mix prompt lengths from 3 to 200 tokens, in non-sorted order, so a packing or
offset bug in the flat (unpadded) batch shows. References run one prompt at a time.
Embeddings: cosine >= 0.9999; probabilities / scores: max abs diff <= 1e-4. Every test
runs under each CPU attention backend (the `attention_backend` fixture: CPU_NATIVE where
its kernel builds, TORCH_SDPA always).
"""
from __future__ import annotations

import pytest
import torch

import model_factory as mf
from vllm import PoolingParams

pytestmark = pytest.mark.usefixtures("attention_backend")

COS_MIN = 0.9999
PROB_TOL = 1e-4


def _prompts(model_dir: str) -> list[str]:
    tok = mf.hf_tokenizer(model_dir)
    prompts = mf.mixed_prompts(tok)
    lengths = [len(tok(p)["input_ids"]) for p in prompts]
    assert min(lengths) <= 5 and max(lengths) >= 190, lengths  # the batch really mixes lengths
    return prompts


def _ids(model_dir: str, text: str) -> list[int]:
    return list(mf.hf_tokenizer(model_dir)(text)["input_ids"])


# ------------------------------------------------------------------ embeddings

EMBED_CASES = [
    # fixture,             pooling, bidirectional reference
    ("bert_embed_dir", "CLS", False),
    ("roberta_embed_dir", "CLS", False),
    ("qwen2_embed_dir", "LAST", False),
    ("qwen3_embed_dir", "LAST", False),
    ("llama_embed_dir", "LAST", False),
    ("qwen2_bidir_dir", "LAST", True),
]


@pytest.mark.parametrize("fixture,pooling,bidirectional", EMBED_CASES,
                         ids=[c[0] for c in EMBED_CASES])
def test_embed_matches_transformers(request, shared_llm, fixture, pooling, bidirectional):
    model_dir = request.getfixturevalue(fixture)
    llm = shared_llm(model_dir)
    prompts = _prompts(model_dir)
    outs = llm.embed(prompts, use_tqdm=False)
    assert len(outs) == len(prompts)
    for prompt, out in zip(prompts, outs):
        ids = _ids(model_dir, prompt)
        assert out.prompt_token_ids == ids
        assert out.finished
        ref = mf.hf_embedding(model_dir, ids, pooling, normalize=True,
                              bidirectional=bidirectional)
        emb = torch.tensor(out.outputs.embedding)
        assert emb.shape == ref.shape
        assert mf.cosine(emb, ref) >= COS_MIN, (fixture, len(ids))
        assert abs(float(emb.norm()) - 1.0) < 1e-4  # normalised by default


@pytest.mark.parametrize("fixture,pooling", [("bert_embed_dir", "CLS"),
                                             ("qwen3_embed_dir", "LAST")])
def test_embed_unnormalized_is_raw_pooled_state(request, shared_llm, fixture, pooling):
    model_dir = request.getfixturevalue(fixture)
    llm = shared_llm(model_dir)
    prompts = _prompts(model_dir)[:4]
    outs = llm.embed(prompts, pooling_params=PoolingParams(normalize=False), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        ref = mf.hf_embedding(model_dir, _ids(model_dir, prompt), pooling, normalize=False)
        emb = torch.tensor(out.outputs.embedding)
        assert mf.cosine(emb, ref) >= COS_MIN
        assert abs(float(emb.norm()) / float(ref.norm()) - 1.0) < 1e-4


def test_bidirectional_qwen2_is_not_causal(shared_llm, qwen2_bidir_dir):
    """A guard on the reference itself, then on the engine: with `is_causal: false` the
    first token's state depends on later tokens, and the engine's LAST embedding differs
    from what a causal run of the same weights would give."""
    ids = _ids(qwen2_bidir_dir, "the quick brown fox jumps over the lazy dog")
    full = mf.hf_hidden_states(qwen2_bidir_dir, ids, bidirectional=True)
    prefix = mf.hf_hidden_states(qwen2_bidir_dir, ids[:3], bidirectional=True)
    assert (full[:3] - prefix).abs().max() > 1e-3
    llm = shared_llm(qwen2_bidir_dir)
    out = llm.embed([{"prompt_token_ids": ids}], use_tqdm=False)[0]
    emb = torch.tensor(out.outputs.embedding)
    assert mf.cosine(emb, mf.hf_embedding(qwen2_bidir_dir, ids, "LAST",
                                          bidirectional=True)) >= COS_MIN


def test_prompt_forms_give_the_same_embedding(shared_llm, qwen3_embed_dir):
    llm = shared_llm(qwen3_embed_dir)
    text = "hello world, a prompt given in three forms"
    ids = _ids(qwen3_embed_dir, text)
    outs = llm.embed([text, {"prompt": text}, {"prompt_token_ids": ids}], use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == [ids] * 3
    first = torch.tensor(outs[0].outputs.embedding)
    for out in outs[1:]:
        assert mf.max_abs_diff(out.outputs.embedding, first) <= 1e-5
    single = llm.embed(text, use_tqdm=False)
    assert len(single) == 1 and mf.max_abs_diff(single[0].outputs.embedding, first) <= 1e-5


def test_repeated_batch_gives_identical_numbers(shared_llm, qwen3_embed_dir, bert_embed_dir):
    """A second run of the same batch (prefix caching on by default for a causal LAST model)
    gives the same numbers, and `num_cached_tokens` never covers a prompt's last token."""
    for model_dir in (qwen3_embed_dir, bert_embed_dir):
        llm = shared_llm(model_dir)
        prompts = _prompts(model_dir)
        first = llm.embed(prompts, use_tqdm=False)
        second = llm.embed(prompts, use_tqdm=False)
        for a, b in zip(first, second):
            assert mf.cosine(a.outputs.embedding, b.outputs.embedding) >= COS_MIN
            for out in (a, b):
                assert isinstance(out.num_cached_tokens, int)
                assert 0 <= out.num_cached_tokens < len(out.prompt_token_ids)
        if model_dir == bert_embed_dir:  # a bidirectional encoder keeps no cache
            assert all(o.num_cached_tokens == 0 for o in first + second)


def test_matryoshka_dimensions(qwen3_embed_dir):
    """`dimensions` cuts the raw pooled state, then normalises (a Matryoshka model)."""
    from vllm import LLM
    llm = LLM(model=qwen3_embed_dir, hf_overrides={"is_matryoshka": True})
    prompts = _prompts(qwen3_embed_dir)[:3]
    outs = llm.embed(prompts, pooling_params=PoolingParams(dimensions=16), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        raw = mf.hf_embedding(qwen3_embed_dir, _ids(qwen3_embed_dir, prompt), "LAST",
                              normalize=False)
        ref = torch.nn.functional.normalize(raw[:16], dim=-1)
        assert len(out.outputs.embedding) == 16
        assert mf.cosine(out.outputs.embedding, ref) >= COS_MIN
        assert abs(float(torch.tensor(out.outputs.embedding).norm()) - 1.0) < 1e-4
    # The pooler override's `dimensions` is the default width; a request may still ask.
    narrow = LLM(model=qwen3_embed_dir, hf_overrides={"is_matryoshka": True},
                 pooler_config={"dimensions": 16})
    default = narrow.embed(prompts, use_tqdm=False)
    torch.testing.assert_close(torch.tensor([o.outputs.embedding for o in default]),
                               torch.tensor([o.outputs.embedding for o in outs]), atol=1e-5,
                               rtol=0)
    wide = narrow.embed(prompts[:1], pooling_params=PoolingParams(dimensions=32),
                        use_tqdm=False)
    assert len(wide[0].outputs.embedding) == 32


# ------------------------------------------------------------------ sentence-transformers

def test_minilm_matches_sentence_transformers(shared_llm, minilm_dir):
    llm = shared_llm(minilm_dir)
    sentences = _prompts(minilm_dir)
    ref = mf.st_encode(minilm_dir, sentences)
    outs = llm.embed(sentences, use_tqdm=False)
    got = torch.tensor([o.outputs.embedding for o in outs])
    assert got.shape == ref.shape == (len(sentences), 384)
    for g, r in zip(got, ref):
        assert mf.cosine(g, r) >= COS_MIN
    assert mf.max_abs_diff(got, ref) <= 1e-4


def test_qwen3_lasttoken_st_dir_matches_sentence_transformers(shared_llm, qwen3_st_dir):
    llm = shared_llm(qwen3_st_dir)
    tok = mf.hf_tokenizer(qwen3_st_dir)
    sentences = mf.mixed_prompts(tok, lengths=(3, 120, 17, 64, 5))
    ref = mf.st_encode(qwen3_st_dir, sentences)
    outs = llm.embed(sentences, use_tqdm=False)
    for out, r in zip(outs, ref):
        assert mf.cosine(out.outputs.embedding, r) >= COS_MIN
    assert mf.max_abs_diff(torch.tensor([o.outputs.embedding for o in outs]), ref) <= 1e-4


# ------------------------------------------------------------------ classification

CLASSIFY_CASES = ["bert_cls_dir", "bert_cls3_dir", "xlmr_cls_dir", "qwen3_cls_dir",
                  "llama_cls_dir"]


@pytest.mark.parametrize("fixture", CLASSIFY_CASES)
def test_classify_matches_transformers(request, shared_llm, fixture):
    model_dir = request.getfixturevalue(fixture)
    llm = shared_llm(model_dir)
    prompts = _prompts(model_dir)
    outs = llm.classify(prompts, use_tqdm=False)
    assert len(outs) == len(prompts)
    spread = []
    for prompt, out in zip(prompts, outs):
        ids = _ids(model_dir, prompt)
        assert out.prompt_token_ids == ids
        ref = mf.probs_from_logits(mf.hf_seqcls_logits(model_dir, ids))
        assert len(out.outputs.probs) == ref.numel()
        assert mf.max_abs_diff(out.outputs.probs, ref) <= PROB_TOL, (fixture, len(ids))
        spread.append(ref[0].item())
    assert max(spread) - min(spread) > 1e-3  # the references are not all the same number


@pytest.mark.parametrize("fixture", ["bert_cls3_dir", "qwen3_cls_dir"])
def test_classify_without_activation_returns_logits(request, shared_llm, fixture):
    model_dir = request.getfixturevalue(fixture)
    llm = shared_llm(model_dir)
    prompts = _prompts(model_dir)[:4]
    outs = llm.classify(prompts, pooling_params=PoolingParams(activation=False),
                        use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        ref = mf.hf_seqcls_logits(model_dir, _ids(model_dir, prompt))
        assert mf.max_abs_diff(out.outputs.probs, ref) <= PROB_TOL


# ------------------------------------------------------------------ scoring

QUERY = "what is the capital city of France"
DOCS = ["Paris", "the quick brown fox jumps over the lazy dog " * 6,
        "Berlin is a city; Paris is the capital of France because of its long history"]


def _pair_reference(model_dir: str, a: str, b: str, token_types: bool):
    enc = mf.hf_tokenizer(model_dir)(a, b)
    tt = enc.get("token_type_ids") if token_types else None
    logits = mf.hf_seqcls_logits(model_dir, enc["input_ids"], token_type_ids=tt)
    return list(enc["input_ids"]), torch.sigmoid(logits).item()


def test_truncated_pair_is_the_tokenizers_longest_first(shared_llm, bert_cls_dir):
    """`truncate_prompt_tokens` on a pair: `tokenizer(a, b, truncation=True, max_length=k)`,
    as upstream (longest first: both texts give up tokens when both are long)."""
    llm = shared_llm(bert_cls_dir)
    tok = mf.hf_tokenizer(bert_cls_dir)
    a, b = mf.text_of_length(tok, 30, seed=1), mf.text_of_length(tok, 30, seed=2)
    ref = tok(a, b, truncation=True, max_length=40)
    out = llm.score(a, b, truncate_prompt_tokens=40, use_tqdm=False)[0]
    assert out.prompt_token_ids == list(ref["input_ids"])
    first = list(ref["token_type_ids"]).count(0) - 2  # [CLS] a [SEP]
    assert first < len(tok(a)["input_ids"]) - 2  # the first text was cut too


@pytest.mark.parametrize("fixture,token_types", [("bert_cls_dir", True),
                                                 ("xlmr_cls_dir", False),
                                                 ("qwen3_cls_dir", False)])
def test_cross_encoder_score_matches_transformers(request, shared_llm, fixture, token_types):
    model_dir = request.getfixturevalue(fixture)
    llm = shared_llm(model_dir)
    # 1 -> N
    outs = llm.score(QUERY, DOCS, use_tqdm=False)
    assert len(outs) == len(DOCS)
    for doc, out in zip(DOCS, outs):
        ids, ref = _pair_reference(model_dir, QUERY, doc, token_types)
        assert out.prompt_token_ids == ids
        assert abs(out.outputs.score - ref) <= PROB_TOL
    # N -> N
    queries = [QUERY, "a question about dogs"]
    outs = llm.score(queries, DOCS[:2], use_tqdm=False)
    assert len(outs) == 2
    for q, doc, out in zip(queries, DOCS[:2], outs):
        assert abs(out.outputs.score - _pair_reference(model_dir, q, doc, token_types)[1]) \
            <= PROB_TOL
    # 1 -> 1
    outs = llm.score(QUERY, DOCS[2], use_tqdm=False)
    assert len(outs) == 1
    assert abs(outs[0].outputs.score - _pair_reference(model_dir, QUERY, DOCS[2],
                                                       token_types)[1]) <= PROB_TOL


def test_bert_pair_uses_token_types(bert_cls_dir):
    """Guard on the reference: the BERT pair really has segment-1 token types and they
    change the score, so the previous test would catch an engine that drops them."""
    enc = mf.hf_tokenizer(bert_cls_dir)(QUERY, DOCS[2])
    assert 1 in enc["token_type_ids"]
    with_tt = mf.hf_seqcls_logits(bert_cls_dir, enc["input_ids"], enc["token_type_ids"])
    without = mf.hf_seqcls_logits(bert_cls_dir, enc["input_ids"])
    assert abs(with_tt.item() - without.item()) > 1e-4


def test_embedding_model_scores_by_cosine(shared_llm, bert_embed_dir):
    llm = shared_llm(bert_embed_dir)
    outs = llm.score(QUERY, DOCS, use_tqdm=False)
    q = mf.hf_embedding(bert_embed_dir, _ids(bert_embed_dir, QUERY), "CLS")
    for doc, out in zip(DOCS, outs):
        d = mf.hf_embedding(bert_embed_dir, _ids(bert_embed_dir, doc), "CLS")
        assert abs(out.outputs.score - mf.cosine(q, d)) <= PROB_TOL


# ------------------------------------------------------------------ Qwen3-Reranker conversion

RERANKER_OVERRIDES = {"architectures": ["Qwen3ForSequenceClassification"],
                      "classifier_from_token": ["no", "yes"],
                      "is_original_qwen3_reranker": True}


@pytest.fixture
def reranker_llm(shared_llm, qwen3_reranker_dir):
    return shared_llm(qwen3_reranker_dir, hf_overrides=RERANKER_OVERRIDES)


def _p_yes(model_dir: str, ids: list[int]) -> float:
    tok = mf.hf_tokenizer(model_dir)
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    logits = mf.hf_lm_logits(model_dir, ids)
    return torch.softmax(logits[[no, yes]], dim=-1)[1].item()


def test_qwen3_reranker_classify_is_p_yes(reranker_llm, qwen3_reranker_dir):
    prompts = _prompts(qwen3_reranker_dir)
    outs = reranker_llm.classify(prompts, use_tqdm=False)
    refs = []
    for prompt, out in zip(prompts, outs):
        ids = _ids(qwen3_reranker_dir, prompt)
        assert out.prompt_token_ids == ids
        assert len(out.outputs.probs) == 1
        ref = _p_yes(qwen3_reranker_dir, ids)
        refs.append(ref)
        assert abs(out.outputs.probs[0] - ref) <= 1e-5
    assert max(refs) - min(refs) > 1e-3


def test_qwen3_reranker_score_is_p_yes(reranker_llm, qwen3_reranker_dir):
    outs = reranker_llm.score(QUERY, DOCS, use_tqdm=False)
    for doc, out in zip(DOCS, outs):
        # without a score template an LLM reranker scores the joined texts (as upstream)
        ids = list(mf.hf_tokenizer(qwen3_reranker_dir)(QUERY + doc)["input_ids"])
        assert out.prompt_token_ids == ids
        assert abs(out.outputs.score - _p_yes(qwen3_reranker_dir, ids)) <= 1e-5


# ------------------------------------------------------------------ reward models

def test_reward_all_pooling_per_token(shared_llm, qwen2_reward_dir):
    llm = shared_llm(qwen2_reward_dir)
    prompts = _prompts(qwen2_reward_dir)
    outs = llm.reward(prompts, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        ids = _ids(qwen2_reward_dir, prompt)
        assert out.prompt_token_ids == ids
        ref = mf.reward_reference(qwen2_reward_dir, ids)
        data = out.outputs.data
        assert isinstance(data, torch.Tensor) and data.dtype == torch.float32
        assert tuple(data.shape) == (len(ids), 1)
        assert mf.max_abs_diff(data, ref) <= PROB_TOL
    # encode with the explicit task gives the same numbers
    enc = llm.encode(prompts[:2], pooling_task="encode", use_tqdm=False)
    for a, b in zip(enc, outs[:2]):
        assert mf.max_abs_diff(a.outputs.data, b.outputs.data) <= 1e-6
    # softmax over one label is a sigmoid (a softmax over one value would be all 1.0)
    act = llm.reward(prompts[:2], pooling_params=PoolingParams(softmax=True), use_tqdm=False)
    for a, b in zip(act, outs[:2]):
        assert mf.max_abs_diff(a.outputs.data, torch.sigmoid(b.outputs.data)) <= 1e-6
        assert float(a.outputs.data.min()) < 0.999


def test_reward_config_without_labels_keeps_the_one_wide_head(shared_llm, qwen2_reward_dir,
                                                              tmp_path):
    """Qwen2.5-Math-RM's config.json has no id2label (transformers then assumes 2 labels);
    its head is 1 wide, as upstream fixes it."""
    import json
    bare = mf.copy_checkpoint(qwen2_reward_dir, tmp_path / "rm")
    cfg = json.loads((bare / "config.json").read_text())
    for key in ("id2label", "label2id", "num_labels"):
        cfg.pop(key, None)
    (bare / "config.json").write_text(json.dumps(cfg))
    prompt = _prompts(qwen2_reward_dir)[0]
    got = shared_llm(bare).reward([prompt], use_tqdm=False)[0].outputs.data
    ref = shared_llm(qwen2_reward_dir).reward([prompt], use_tqdm=False)[0].outputs.data
    assert got.shape[-1] == 1 and mf.max_abs_diff(got, ref) <= 1e-6


def test_causal_lm_served_as_reward_model_returns_its_hidden_states(qwen2_embed_dir):
    """convert="reward" on a plain *ForCausalLM (no score head in the checkpoint): ALL
    pooling over the final hidden states, as upstream's reward adapter."""
    from vllm import LLM
    llm = LLM(model=qwen2_embed_dir, convert="reward")
    prompts = _prompts(qwen2_embed_dir)[:3]
    for prompt, out in zip(prompts, llm.reward(prompts, use_tqdm=False)):
        ids = _ids(qwen2_embed_dir, prompt)
        ref = mf.hf_hidden_states(qwen2_embed_dir, ids)
        assert tuple(out.outputs.data.shape) == tuple(ref.shape) == (len(ids), ref.shape[-1])
        assert mf.max_abs_diff(out.outputs.data, ref) <= 1e-4


PRM_TEXT = ("first step: two and two are four<extra_0>second step: the result is "
            "the answer<extra_0>so the answer is four<extra_0>")


def test_process_reward_step_pooling(shared_llm, qwen2_prm_dir):
    llm = shared_llm(qwen2_prm_dir)
    tag = mf.bpe_token_id(mf.STEP_TAG)
    ids = _ids(qwen2_prm_dir, PRM_TEXT)
    assert ids.count(tag) == 3
    ref = mf.reward_reference(qwen2_prm_dir, ids)          # [T, 2]
    rows = ref[torch.tensor(ids) == tag]                      # [3, 2]
    prompts = [PRM_TEXT, "a step without tag<extra_0>" + PRM_TEXT]

    outs = llm.encode(prompts, pooling_params=PoolingParams(step_tag_id=tag, softmax=False),
                      pooling_task="encode", use_tqdm=False)
    assert tuple(outs[0].outputs.data.shape) == (3, 2)
    assert mf.max_abs_diff(outs[0].outputs.data, rows) <= PROB_TOL
    assert tuple(outs[1].outputs.data.shape) == (4, 2)

    outs = llm.encode(PRM_TEXT, pooling_params=PoolingParams(step_tag_id=tag, softmax=True),
                      pooling_task="encode", use_tqdm=False)
    assert mf.max_abs_diff(outs[0].outputs.data, torch.softmax(rows, dim=-1)) <= PROB_TOL

    outs = llm.encode(PRM_TEXT, pooling_params=PoolingParams(
        step_tag_id=tag, returned_token_ids=[1], softmax=False),
        pooling_task="encode", use_tqdm=False)
    assert tuple(outs[0].outputs.data.shape) == (3, 1)
    assert mf.max_abs_diff(outs[0].outputs.data, rows[:, [1]]) <= PROB_TOL

    # As upstream: the returned columns are picked first, then the activation runs on them
    # (one column: a sigmoid; not the softmax over every column, then picked).
    outs = llm.encode(PRM_TEXT, pooling_params=PoolingParams(
        step_tag_id=tag, returned_token_ids=[1], softmax=True),
        pooling_task="encode", use_tqdm=False)
    assert mf.max_abs_diff(outs[0].outputs.data, torch.sigmoid(rows[:, [1]])) <= PROB_TOL
    assert mf.max_abs_diff(torch.sigmoid(rows[:, [1]]), torch.softmax(rows, -1)[:, [1]]) > 1e-3


def test_roberta_position_offset_follows_pad_token_id():
    """Positions start at padding_idx + 1; a pad_token_id of 0 is 0, not the default 1."""
    import types
    from vllm.model_executor.models.roberta import RobertaModel
    offset = RobertaModel._position_offset
    assert offset(None, types.SimpleNamespace(pad_token_id=0)) == 1
    assert offset(None, types.SimpleNamespace(pad_token_id=1)) == 2
    assert offset(None, types.SimpleNamespace(pad_token_id=None)) == 2


def test_mean_pooling_stays_float32_for_a_bfloat16_model():
    """MEAN sums and divides in float32 and hands float32 on (as upstream), so a bfloat16
    model's mean is not rounded back to bfloat16 before normalising."""
    from vllm.model_executor.layers.pooler import PoolingSlice, _mean_pool
    hidden = torch.randn(7, 16, generator=torch.Generator().manual_seed(0)).bfloat16()
    slices = [PoolingSlice(0, 3, 0, [1, 2, 3], PoolingParams()),
              PoolingSlice(3, 4, 0, [1, 2, 3, 4], PoolingParams())]
    got = _mean_pool(hidden, slices)
    want = torch.stack([hidden[:3].double().mean(0), hidden[3:].double().mean(0)])
    assert got.dtype == torch.float32
    assert float((got.double() - want).abs().max()) < 1e-6
