"""Embeddings longer than max_model_len with pooler_config enable_chunked_processing: the
token-weighted mean of the chunks' embeddings, re-normalised, against hand-chunked calls."""
from __future__ import annotations

import json

import numpy as np
import torch
import pytest

import model_factory as mf
from servers import Server, _engine
from vllm import LLM
from vllm.entrypoints.openai.cli_args import engine_args_from_namespace, parse_serve_args

CHUNKED = {"enable_chunked_processing": True, "max_embed_len": 64}


def _long_text(path, n_tokens: int) -> str:
    return mf.text_of_length(mf.hf_tokenizer(path), n_tokens, seed=3)


@pytest.mark.parametrize("name", ["bert_embed_dir", "qwen3_embed_dir"])
def test_chunked_embedding_is_weighted_mean_of_chunks(name, request, shared_llm):
    path = request.getfixturevalue(name)
    llm = LLM(model=path, max_model_len=16, pooler_config=CHUNKED)
    text = _long_text(path, 40)
    ids = mf.hf_tokenizer(path)(text)["input_ids"]
    assert len(ids) > 16
    before = llm.llm_engine.stats
    out = llm.embed([text, "short one"], use_tqdm=False)
    assert out[0].prompt_token_ids == ids  # usage counts every token
    assert llm.llm_engine.stats.computed_tokens - before.computed_tokens == len(ids) + len(
        out[1].prompt_token_ids)
    plain = shared_llm(path, max_model_len=16)  # no switch: each chunk alone
    chunks = [ids[i:i + 16] for i in range(0, len(ids), 16)]
    embs = np.array([plain.embed({"prompt_token_ids": c}, use_tqdm=False)[0].outputs.embedding
                     for c in chunks])
    mean = (embs * np.array([len(c) for c in chunks])[:, None]).sum(0) / len(ids)
    np.testing.assert_allclose(out[0].outputs.embedding, mean / np.linalg.norm(mean),
                               atol=1e-5)
    with pytest.raises(ValueError, match="max_embed_len is 64 tokens"):
        llm.embed([_long_text(path, 80)], use_tqdm=False)


def test_too_long_without_the_switch_names_it(bert_embed_dir):
    engine = _engine(bert_embed_dir, max_model_len=16)
    server = Server(engine)
    try:
        text = _long_text(bert_embed_dir, 30)
        n = len(mf.hf_tokenizer(bert_embed_dir)(text)["input_ids"])
        r = server.post("/v1/embeddings", {"input": text})
    finally:
        server.close()
        engine.shutdown()
    assert r.status_code == 400
    assert r.json() == {"error": {
        "message": f"This model's maximum context length is 16 tokens. However, you requested "
                   f"{n} tokens in the input for pooling. Please reduce the length of the "
                   "input prompt, or pass truncate_prompt_tokens, or embed it in chunks: start "
                   'with pooler_config {"enable_chunked_processing": true, "max_embed_len": '
                   'N}.',
        "type": "BadRequestError", "param": "input", "code": 400}}


def test_pooler_config_flag_and_bad_combination(bert_embed_dir):
    args = parse_serve_args([bert_embed_dir, "--pooler-config",
                             '{"enable_chunked_processing": true, "max_embed_len": 64}'])
    config = engine_args_from_namespace(args).create_engine_config().model_config
    assert config.pooler_config.enable_chunked_processing is True
    assert config.pooler_config.max_embed_len == 64
    with pytest.raises(ValueError, match="max_embed_len needs enable_chunked_processing"):
        LLM(model=bert_embed_dir, pooler_config={"max_embed_len": 64})


def test_chunk_weights_leave_out_an_unpooled_prompt(bert_st_mean_dir, tmp_path):
    """include_prompt false (MEAN, no Normalize): the result is the mean over every pooled
    token, so the first chunk weighs its tokens after the prompt, not all of them."""
    path = mf.copy_checkpoint(bert_st_mean_dir, tmp_path / "m")
    conf = path / "1_Pooling" / "config.json"
    conf.write_text(json.dumps({**json.loads(conf.read_text()), "include_prompt": False}))
    llm = LLM(model=str(path), max_model_len=16, pooler_config=CHUNKED)
    tok = mf.hf_tokenizer(path)
    prompt, text = "passage: ", _long_text(path, 40)
    ids = tok(prompt + text)["input_ids"]
    skip = len(tok(prompt)["input_ids"]) - 1  # [CLS] and the prompt's tokens, no [SEP]
    got = llm.embed([text], prompt=prompt, use_tqdm=False)[0]
    assert got.prompt_token_ids == ids
    chunks = [ids[i:i + 16] for i in range(0, len(ids), 16)]
    rows = [mf.hf_hidden_states(path, c)[skip if i == 0 else 0:] for i, c in enumerate(chunks)]
    ref = torch.cat(rows).mean(0).numpy()
    np.testing.assert_allclose(got.outputs.embedding, ref, atol=1e-5)
