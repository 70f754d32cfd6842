"""Native implementations of issue 36's most-used families beside MPNet
(`test_native_mpnet.py`), each equal to transformers / sentence-transformers on tiny seeded
checkpoints: BERT / RoBERTa masked-LM checkpoints served as embedders (as upstream 0.33) and
bidirectional Llama (llama-nemotron-embed / nemotron-rerank)."""
from __future__ import annotations

import pathlib

import pytest
import torch

import model_factory as mf
import native_family_models as nf
from native_family_models import ATOL, assert_native_encoder, check_embedding, prompts_of
from vllm import LLM, PoolingParams


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("native_families")


# ------------------------------------------------------------ masked-LM checkpoints

@pytest.fixture(scope="module")
def bert_mlm_st_dir(root) -> str:
    return str(mf.write_st_files(nf.make_masked_lm(root / "bert_mlm_st", "bert"),
                                 pooling="mean", normalize=True))


@pytest.fixture(scope="module")
def bert_mlm_dir(root) -> str:
    return str(nf.make_masked_lm(root / "bert_mlm", "bert", seed=nf.SEED + 20))


@pytest.fixture(scope="module")
def roberta_mlm_dir(root) -> str:
    return str(nf.make_masked_lm(root / "roberta_mlm", "roberta", seed=nf.SEED + 21))


@pytest.mark.parametrize("name,backbone", [("bert_mlm_dir", "BertMaskedLMEmbeddingModel"),
                                           ("roberta_mlm_dir", "RobertaMaskedLMEmbeddingModel")])
def test_masked_lm_checkpoint_embeds_cls(name, backbone, request):
    """As upstream: the encoder's CLS state (the MLM head plays no part in embed)."""
    path = request.getfixturevalue(name)
    llm = LLM(path, dtype="float32")
    assert_native_encoder(llm, "CLS")
    assert type(llm.llm_engine.runner.model.model).__name__ == backbone
    for out in llm.embed(prompts_of(path), use_tqdm=False):
        check_embedding(out.outputs.embedding,
                        mf.hf_embedding(path, out.prompt_token_ids, "CLS"))


def test_bert_masked_lm_with_st_files_equals_st(bert_mlm_st_dir):
    llm = LLM(bert_mlm_st_dir, dtype="float32")
    assert_native_encoder(llm, "MEAN")
    prompts = prompts_of(bert_mlm_st_dir)
    for out, ref in zip(llm.embed(prompts, use_tqdm=False),
                        mf.st_encode(bert_mlm_st_dir, prompts)):
        check_embedding(out.outputs.embedding, ref)


def test_bert_masked_lm_token_classify_is_mlm_logits(bert_mlm_dir):
    """Upstream's BertForMaskedLM output: per-token vocabulary logits of the tied head."""
    import transformers
    llm = LLM(bert_mlm_dir, dtype="float32", pooler_config={"task": "token_classify"})
    hf = transformers.BertForMaskedLM.from_pretrained(bert_mlm_dir, dtype=torch.float32).eval()
    prompts = prompts_of(bert_mlm_dir, (9, 40))
    raw = llm.encode(prompts, PoolingParams(activation=False), use_tqdm=False)
    for out, probs in zip(raw, llm.encode(prompts, use_tqdm=False)):
        ids = torch.tensor([out.prompt_token_ids])
        with torch.inference_mode():
            ref = hf(input_ids=ids).logits[0]
        got = torch.as_tensor(out.outputs.data)
        assert got.shape == ref.shape
        assert mf.max_abs_diff(got, ref) <= 1e-3 * ref.abs().max().item()
        assert mf.max_abs_diff(probs.outputs.data, torch.softmax(ref, dim=-1)) <= ATOL


# ------------------------------------------------------------------ bidirectional Llama

@pytest.fixture(scope="module")
def nemotron_embed_dir(root) -> str:
    return str(nf.make_llama_bidirectional(root / "nemotron_embed"))


@pytest.fixture(scope="module")
def nemotron_rerank_dir(root) -> str:
    return str(nf.make_llama_bidirectional(
        root / "nemotron_rerank", cls="LlamaBidirectionalForSequenceClassification",
        num_labels=1, seed=nf.SEED + 30))


def llama_bidirectional_states(path: str, token_ids, head: bool = False) -> torch.Tensor:
    """transformers' Llama on one prompt with an explicit all-true 4-D mask (surely
    bidirectional): final hidden states [T, H], or with `head` the score of their mean."""
    import transformers
    cls = transformers.LlamaForSequenceClassification if head else transformers.LlamaModel
    model = cls.from_pretrained(path, dtype=torch.float32).eval()
    n = len(token_ids)
    with torch.inference_mode():
        base = model.model if head else model
        hs = base(input_ids=torch.tensor([list(token_ids)]),
                  attention_mask=torch.ones(1, 1, n, n, dtype=torch.bool)).last_hidden_state[0]
        return model.score(hs.mean(0)) if head else hs


def test_llama_bidirectional_embeds_mean_without_cache(nemotron_embed_dir, vllm_log):
    llm = LLM(nemotron_embed_dir, dtype="float32", enable_prefix_caching=True)
    assert_native_encoder(llm, "MEAN")
    assert not llm.llm_engine.vllm_config.model_config.is_causal
    assert not llm.llm_engine.runner.kv_caches
    assert any(r.levelname == "WARNING" and "Prefix caching" in r.getMessage()
               for r in vllm_log.records)
    for out in llm.embed(prompts_of(nemotron_embed_dir), use_tqdm=False):
        ref = llama_bidirectional_states(nemotron_embed_dir, out.prompt_token_ids).mean(0)
        check_embedding(out.outputs.embedding, torch.nn.functional.normalize(ref, dim=-1))


def test_llama_bidirectional_embedder_reads_pooling_field(nemotron_embed_dir, root):
    """The embedder pools as its config's `pooling` says too (cls: the first state)."""
    path = mf.copy_checkpoint(nemotron_embed_dir, root / "nemotron_embed_cls", pooling="cls")
    llm = LLM(str(path), dtype="float32")
    assert_native_encoder(llm, "CLS")
    for out in llm.embed(prompts_of(str(path), (9,)), use_tqdm=False):
        ref = llama_bidirectional_states(str(path), out.prompt_token_ids)[0]
        check_embedding(out.outputs.embedding, torch.nn.functional.normalize(ref, dim=-1))


def test_llama_bidirectional_hub_model_type_loads(nemotron_embed_dir, root):
    """The hub's config.json says model_type `llama_bidirec` (its config class is remote
    code): read as a plain config of its keys, without running remote code."""
    path = mf.copy_checkpoint(nemotron_embed_dir, root / "nemotron_hub_type",
                              model_type="llama_bidirec")
    llm = LLM(str(path), dtype="float32")
    assert_native_encoder(llm, "MEAN")
    for out in llm.embed(prompts_of(str(path), (12,)), use_tqdm=False):
        ref = llama_bidirectional_states(nemotron_embed_dir, out.prompt_token_ids).mean(0)
        check_embedding(out.outputs.embedding, torch.nn.functional.normalize(ref, dim=-1))


def test_llama_bidirectional_differs_from_causal_llama(nemotron_embed_dir, root):
    """The same weights served as a causal LlamaModel give other numbers (the test above
    would not notice a causal mask otherwise)."""
    causal_dir = mf.copy_checkpoint(nemotron_embed_dir, root / "nemotron_as_causal",
                                    architectures=["LlamaModel"])
    prompt = prompts_of(nemotron_embed_dir, (30,))
    a = LLM(nemotron_embed_dir, dtype="float32").embed(prompt, use_tqdm=False)[0]
    b = LLM(str(causal_dir), dtype="float32",
            pooler_config={"pooling_type": "MEAN"}).embed(prompt, use_tqdm=False)[0]
    assert mf.cosine(a.outputs.embedding, b.outputs.embedding) < 0.999


def test_llama_bidirectional_reranker_scores_mean_state(nemotron_rerank_dir):
    llm = LLM(nemotron_rerank_dir, dtype="float32")
    assert_native_encoder(llm, "MEAN")   # from the config's `pooling: avg`
    for out in llm.classify(prompts_of(nemotron_rerank_dir), use_tqdm=False):
        logit = llama_bidirectional_states(nemotron_rerank_dir, out.prompt_token_ids, head=True)
        assert abs(out.outputs.probs[0] - torch.sigmoid(logit).item()) <= ATOL


@pytest.mark.parametrize("field,pooling", [("cls", "CLS"), ("last", "LAST")])
def test_llama_bidirectional_reranker_reads_pooling_field(nemotron_rerank_dir, root, field,
                                                          pooling):
    path = mf.copy_checkpoint(nemotron_rerank_dir, root / f"nemotron_rerank_{field}",
                              pooling=field)
    llm = LLM(str(path), dtype="float32")
    assert_native_encoder(llm, pooling)


def test_llama_bidirectional_refuses_unknown_pooling_field(nemotron_rerank_dir, root):
    path = mf.copy_checkpoint(nemotron_rerank_dir, root / "nemotron_rerank_bad",
                              pooling="max")
    with pytest.raises(ValueError, match="pooling 'max'"):
        LLM(str(path), dtype="float32")


def test_llama_bidirectional_reranker_served_as_embedder(nemotron_rerank_dir):
    llm = LLM(nemotron_rerank_dir, dtype="float32", convert="embed")
    assert_native_encoder(llm, "MEAN")
    for out in llm.embed(prompts_of(nemotron_rerank_dir, (6, 50)), use_tqdm=False):
        ref = llama_bidirectional_states(nemotron_rerank_dir, out.prompt_token_ids).mean(0)
        check_embedding(out.outputs.embedding, torch.nn.functional.normalize(ref, dim=-1))


# nemotron-rerank's documented prompt ("question:{query} \n \n passage:{passage}"), written as
# a score template (upstream 0.33 ships the same layout as an example template).
NEMOTRON_TEMPLATE = (
    "question:{{ (messages | selectattr('role', 'equalto', 'query') | first).content }}"
    " \n \n passage:"
    "{{ (messages | selectattr('role', 'equalto', 'document') | first).content }}")


def test_nemotron_rerank_template_equals_model_card(nemotron_rerank_dir, tmp_path):
    """Scored through the template (offline and /score, /rerank via the same front), each
    pair equals the model card's usage: tokenizer(f"question:{q} \\n \\n passage:{p}") with
    its special tokens, the bidirectional backbone, the mean state, the score head, sigmoid."""
    import transformers
    query = "how much protein should a female eat"
    docs = ["the average requirement of protein for women is 46 grams per day",
            "the highest point of a mountain"]
    template = tmp_path / "nemotron-rerank.jinja"
    template.write_text(NEMOTRON_TEMPLATE)
    llm = LLM(nemotron_rerank_dir, dtype="float32", chat_template=str(template))
    tok = transformers.AutoTokenizer.from_pretrained(nemotron_rerank_dir)
    for out, doc in zip(llm.score(query, docs, use_tqdm=False), docs):
        ids = tok(f"question:{query} \n \n passage:{doc}")["input_ids"]
        logit = llama_bidirectional_states(nemotron_rerank_dir, ids, head=True)
        assert abs(out.outputs.score - torch.sigmoid(logit).item()) <= ATOL
