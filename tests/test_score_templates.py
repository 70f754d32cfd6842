"""LLM rerankers scored through score templates (`--chat-template`), as upstream vLLM 0.33.

Each layout is checked against its documented reference usage in transformers on the same
tiny checkpoint: the prompt built as the model card builds it, the causal LM run alone, the
logits of the named tokens put through the documented formula.
- Qwen3-Reranker (original checkpoint): P(yes) = softmax(logit_no, logit_yes)[yes];
- mxbai-rerank-v2 (`method: from_2_way_softmax`, tokens "0"/"1"): softmax(l_0, l_1)[1];
- bge-reranker-v2-gemma (`method: no_post_processing`, one token): sigmoid(logit_yes). The tiny
  BPE vocabulary has no single "Yes" token, so its "yes" stands in.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

import model_factory as mf
from servers import Server, _engine
from vllm import LLM
from vllm.entrypoints.openai.cli_args import engine_args_from_namespace, parse_serve_args

TOL = 1e-4
QUERY = "what is the capital city of paris"
DOCS = ["Paris is the capital city", "the quick brown fox jumps over the lazy dog",
        "a small green house by the river"]
DEFAULT_INSTRUCTION = "given a search query retrieve relevant passages"

# Qwen3-Reranker's prompt (its model card's format) as a score template.
QWEN3_SYSTEM = ("Judge whether the Document meets the requirements based on the Query and the "
                "Instruct provided. Note that the answer can only be \"yes\" or \"no\".")
QWEN3_TEMPLATE = (
    "<|im_start|>system\n" + QWEN3_SYSTEM + "<|im_end|>\n<|im_start|>user\n"
    "<Instruct>: {{ instruction | default('" + DEFAULT_INSTRUCTION + "') }}\n"
    "<Query>: {{ (messages | selectattr('role', 'equalto', 'query') | first).content }}\n"
    "<Document>: {{ (messages | selectattr('role', 'equalto', 'document') | first).content }}"
    # Jinja drops a template's final newline: the closing pair is written as an expression
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>{{ '\\n\\n' }}")
QWEN3_OVERRIDES = {"architectures": ["Qwen3ForSequenceClassification"],
                   "classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": True}

# mxbai-rerank-v2's layout: a chat prompt that asks for 0 or 1.
MXBAI_TEMPLATE = (
    "<|endoftext|><|im_start|>system\nyou are a search model<|im_end|>\n<|im_start|>user\n"
    "query: {{ messages[0].content }}\ndocument: {{ messages[1].content }}\n"
    "judge whether the document is relevant: 0 or 1<|im_end|>\n<|im_start|>assistant"
    "{{ '\\n' }}")
MXBAI_OVERRIDES = {"architectures": ["Qwen2ForSequenceClassification"],
                   "classifier_from_token": ["0", "1"], "method": "from_2_way_softmax"}

# bge-reranker-v2-gemma's layout: "A: {query}\nB: {passage}\n{prompt}", scored by "Yes".
GEMMA_PROMPT = "judge whether the passage B answers the query A with yes or no"
GEMMA_TEMPLATE = ("A: {{ messages[0].content }}\nB: {{ messages[1].content }}\n"
                  + GEMMA_PROMPT)
GEMMA_OVERRIDES = {"architectures": ["GemmaForSequenceClassification"],
                   "classifier_from_token": ["yes"], "method": "no_post_processing"}


# ------------------------------------------------------------------ references

def _qwen3_prompt(query: str, doc: str, instruction: str = DEFAULT_INSTRUCTION) -> str:
    """The Qwen3-Reranker model card's prompt, built by hand."""
    return (f"<|im_start|>system\n{QWEN3_SYSTEM}<|im_end|>\n<|im_start|>user\n"
            f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"
            "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def _two_way(model_dir, text: str, false: str, true: str) -> tuple[list[int], float]:
    """(ids, softmax over the two tokens' next-token logits, at `true`)."""
    tok = mf.hf_tokenizer(model_dir)
    ids = list(tok(text)["input_ids"])
    logits = mf.hf_lm_logits(model_dir, ids)
    pair = logits[[tok.convert_tokens_to_ids(false), tok.convert_tokens_to_ids(true)]]
    return ids, torch.softmax(pair, dim=-1)[1].item()


def _check(outs, refs) -> None:
    got = [o.outputs.score for o in outs]
    for out, (ids, ref) in zip(outs, refs):
        assert out.prompt_token_ids == ids
        assert abs(out.outputs.score - ref) <= TOL, (out.outputs.score, ref)
    assert max(got) - min(got) > 1e-4  # the documents really score differently


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def template_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("templates") / "qwen3_reranker.jinja"
    path.write_text(QWEN3_TEMPLATE)
    return str(path)


@pytest.fixture(scope="module")
def templated_llm(qwen3_reranker_dir, template_file):
    return LLM(qwen3_reranker_dir, hf_overrides=QWEN3_OVERRIDES, chat_template=template_file)


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory) -> str:
    """A tiny GemmaForCausalLM (tied embeddings, as the real 2B) with the BPE tokenizer."""
    import transformers
    path = tmp_path_factory.mktemp("bge_gemma")
    cfg = transformers.GemmaConfig(
        vocab_size=mf.BPE_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
        bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(mf.SEED + 40)
    model = transformers.GemmaForCausalLM(cfg)
    mf._perturb(model)
    mf._save(model, path)
    mf.save_bpe_tokenizer(path)
    return str(path)


# ------------------------------------------------------------------ Qwen3-Reranker

def test_qwen3_reranker_template_equals_model_card(templated_llm, qwen3_reranker_dir):
    outs = templated_llm.score(QUERY, DOCS, use_tqdm=False)
    _check(outs, [_two_way(qwen3_reranker_dir, _qwen3_prompt(QUERY, d), "no", "yes")
                  for d in DOCS])


def test_template_prefix_is_cached_and_exact(templated_llm):
    """The template's shared head (system prompt, instruction, query) is served from the
    prefix cache on the second pass, with the same numbers."""
    assert templated_llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    first = templated_llm.score(QUERY, DOCS, use_tqdm=False)
    second = templated_llm.score(QUERY, DOCS, use_tqdm=False)
    assert all(o.num_cached_tokens > 0 for o in second)
    for a, b in zip(first, second):
        assert abs(a.outputs.score - b.outputs.score) <= 1e-6


def test_per_call_template_and_kwargs(shared_llm, qwen3_reranker_dir, templated_llm):
    """LLM.score(chat_template=...) on an engine without one; chat_template_kwargs fill it."""
    plain = shared_llm(qwen3_reranker_dir, hf_overrides=QWEN3_OVERRIDES)
    outs = plain.score(QUERY, DOCS, use_tqdm=False, chat_template=QWEN3_TEMPLATE)
    _check(outs, [_two_way(qwen3_reranker_dir, _qwen3_prompt(QUERY, d), "no", "yes")
                  for d in DOCS])
    instruction = "find a document about animals"
    outs = templated_llm.score(QUERY, DOCS, use_tqdm=False,
                               chat_template_kwargs={"instruction": instruction})
    _check(outs, [_two_way(qwen3_reranker_dir, _qwen3_prompt(QUERY, d, instruction), "no",
                           "yes") for d in DOCS])


def test_sentence_transformers_cross_encoder_template(qwen3_reranker_dir, tmp_path):
    """A CrossEncoder whose Transformer module takes messages is scored through the template
    its tokenizer carries, with the template settings its config saves."""
    path = tmp_path / "st_reranker"
    shutil.copytree(qwen3_reranker_dir, path)
    tok = mf.hf_tokenizer(path)
    tok.chat_template = QWEN3_TEMPLATE
    tok.save_pretrained(str(path))
    (path / "config_sentence_transformers.json").write_text(
        json.dumps({"model_type": "CrossEncoder"}))
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]))
    (path / "sentence_bert_config.json").write_text(json.dumps({
        "transformer_task": "sequence-classification",
        "modality_config": {"message": {"method": "forward", "method_output_name": "logits"}},
        "processing_kwargs": {"chat_template": {"instruction": "rank the cities"}}}))
    llm = LLM(str(path), hf_overrides=QWEN3_OVERRIDES)
    outs = llm.score(QUERY, DOCS, use_tqdm=False)
    _check(outs, [_two_way(path, _qwen3_prompt(QUERY, d, "rank the cities"), "no", "yes")
                  for d in DOCS])


# ------------------------------------------------------------------ other layouts

def test_mxbai_rerank_v2_from_2_way_softmax(qwen2_embed_dir):
    llm = LLM(qwen2_embed_dir, hf_overrides=MXBAI_OVERRIDES, chat_template=MXBAI_TEMPLATE)
    assert llm.llm_engine.model_config.num_labels == 1
    outs = llm.score(QUERY, DOCS, use_tqdm=False)
    refs = []
    for d in DOCS:
        text = ("<|endoftext|><|im_start|>system\nyou are a search model<|im_end|>\n"
                f"<|im_start|>user\nquery: {QUERY}\ndocument: {d}\njudge whether the "
                "document is relevant: 0 or 1<|im_end|>\n<|im_start|>assistant\n")
        refs.append(_two_way(qwen2_embed_dir, text, "0", "1"))
    _check(outs, refs)


def test_bge_reranker_v2_gemma_yes_logit(gemma_dir):
    llm = LLM(gemma_dir, hf_overrides=GEMMA_OVERRIDES, chat_template=GEMMA_TEMPLATE)
    tok = mf.hf_tokenizer(gemma_dir)
    yes = tok.convert_tokens_to_ids("yes")
    refs = []
    for d in DOCS:
        ids = list(tok(f"A: {QUERY}\nB: {d}\n{GEMMA_PROMPT}")["input_ids"])
        refs.append((ids, torch.sigmoid(mf.hf_lm_logits(gemma_dir, ids)[yes]).item()))
    _check(llm.score(QUERY, DOCS, use_tqdm=False), refs)
    second = llm.score(QUERY, DOCS, use_tqdm=False)
    assert all(o.num_cached_tokens > 0 for o in second)
    assert [o.outputs.score for o in second] == pytest.approx([r for _, r in refs], abs=TOL)


# ------------------------------------------------------------------ the server

def test_score_and_rerank_routes(qwen3_reranker_dir, template_file):
    engine = _engine(qwen3_reranker_dir, hf_overrides=QWEN3_OVERRIDES,
                     chat_template=template_file)
    server = Server(engine)
    try:
        refs = [_two_way(qwen3_reranker_dir, _qwen3_prompt(QUERY, d), "no", "yes")[1]
                for d in DOCS]
        r = server.post("/score", {"text_1": QUERY, "text_2": DOCS})
        assert r.status_code == 200, r.text
        assert [x["score"] for x in r.json()["data"]] == pytest.approx(refs, abs=TOL)
        r = server.post("/rerank", {"query": QUERY, "documents": DOCS,
                                    "instruction": "find animals"})
        assert r.status_code == 200, r.text
        want = {i: _two_way(qwen3_reranker_dir, _qwen3_prompt(QUERY, d, "find animals"),
                            "no", "yes")[1] for i, d in enumerate(DOCS)}
        for res in r.json()["results"]:
            assert abs(res["relevance_score"] - want[res["index"]]) <= TOL
        r = server.post("/score", {"text_1": QUERY, "text_2": DOCS,
                                   "chat_template_kwargs": {"tokenize": True}})
        assert r.status_code == 400 and "tokenize" in r.json()["error"]["message"]
        r = server.post("/rerank", {"query": QUERY, "documents": DOCS, "max_chunks_per_doc": 2})
        assert r.status_code == 400 and "template" in r.json()["error"]["message"]
    finally:
        server.close()
        engine.shutdown()


# ------------------------------------------------------------------ refusals

def test_bad_template_paths_are_clear_errors(qwen3_reranker_dir, templated_llm):
    missing = "/nonexistent/dir/reranker.jinja"
    with pytest.raises(ValueError, match="looks like a file path"):
        LLM(qwen3_reranker_dir, hf_overrides=QWEN3_OVERRIDES, chat_template=missing)
    with pytest.raises(ValueError, match="looks like a file path"):
        templated_llm.score(QUERY, DOCS, use_tqdm=False, chat_template="missing.jinja")
    args = parse_serve_args([qwen3_reranker_dir, "--chat-template", missing,
                             "--hf-overrides", json.dumps(QWEN3_OVERRIDES)])
    assert args.chat_template == missing
    with pytest.raises(ValueError, match="looks like a file path"):
        engine_args_from_namespace(args).create_engine_config()  # `vllm serve` start-up


def test_bad_method_and_template_variables(qwen3_reranker_dir, templated_llm):
    with pytest.raises(ValueError, match="method='softmax' is not supported"):
        LLM(qwen3_reranker_dir, hf_overrides={**MXBAI_OVERRIDES, "method": "softmax",
                                              "architectures": QWEN3_OVERRIDES["architectures"]})
    with pytest.raises(ValueError, match="exactly two tokens"):
        LLM(qwen3_reranker_dir, hf_overrides={**QWEN3_OVERRIDES,
                                              "classifier_from_token": ["yes"]})
    with pytest.raises(ValueError, match="may not set"):
        templated_llm.score(QUERY, DOCS, use_tqdm=False, chat_template_kwargs={"messages": 1})
    with pytest.raises(ValueError, match="failed to render"):
        templated_llm.score(QUERY, DOCS, use_tqdm=False, chat_template="{{ 1 / 0 }}")
