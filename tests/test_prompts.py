"""sentence-transformers prompts: `prompts` / `default_prompt_name` read from
config_sentence_transformers.json, `prompt_name` and raw `prompt` on LLM.embed and
/v1/embeddings, checked against `SentenceTransformer.encode(..., prompt_name=...)`."""
from __future__ import annotations

import json

import numpy as np
import pytest

import model_factory as mf
from servers import _model_server
from test_server import _ok
from vllm import LLM

PROMPTS = {"query": "query: ", "passage": "passage: "}
TEXTS = ["how do cats sleep", "the weather today"]


@pytest.fixture(scope="module")
def prompt_dir(bert_st_mean_dir, tmp_path_factory):
    path = mf.copy_checkpoint(bert_st_mean_dir, tmp_path_factory.mktemp("prompts") / "m")
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": PROMPTS, "default_prompt_name": "query"}))
    return str(path)


@pytest.fixture(scope="module")
def st_model(prompt_dir):
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(prompt_dir, device="cpu")


def _embeds(outs) -> np.ndarray:
    return np.array([o.outputs.embedding for o in outs])


def test_llm_prompts_match_sentence_transformers(prompt_dir, st_model):
    llm = LLM(model=prompt_dir)
    tok = mf.hf_tokenizer(prompt_dir)
    for name in PROMPTS:
        outs = llm.embed(TEXTS, prompt_name=name, use_tqdm=False)
        ref = st_model.encode(TEXTS, prompt_name=name, convert_to_numpy=True)
        np.testing.assert_allclose(_embeds(outs), ref, atol=1e-5)
        assert [o.prompt_token_ids for o in outs] == [
            tok(PROMPTS[name] + t)["input_ids"] for t in TEXTS]  # prompt tokens counted
    raw = llm.embed(TEXTS, prompt="passage: ", use_tqdm=False)
    np.testing.assert_allclose(_embeds(raw), st_model.encode(TEXTS, prompt="passage: "),
                               atol=1e-5)
    default = llm.embed(TEXTS, use_tqdm=False)  # default_prompt_name, as encode()
    np.testing.assert_allclose(_embeds(default), st_model.encode(TEXTS), atol=1e-5)
    bare = llm.embed(TEXTS, prompt="", use_tqdm=False)
    np.testing.assert_allclose(_embeds(bare), st_model.encode(TEXTS, prompt=""), atol=1e-5)
    with pytest.raises(ValueError, match="Unknown prompt_name 'doc'; this model's prompts "
                                         "are: 'query', 'passage'."):
        llm.embed(TEXTS, prompt_name="doc", use_tqdm=False)


@pytest.fixture(scope="module")
def server(prompt_dir):
    yield from _model_server(prompt_dir)


def test_server_prompt_name(server, prompt_dir, st_model):
    out = _ok(server.post("/v1/embeddings", {"input": TEXTS, "prompt_name": "passage"}))
    np.testing.assert_allclose([d["embedding"] for d in out["data"]],
                               st_model.encode(TEXTS, prompt_name="passage"), atol=1e-5)
    tok = mf.hf_tokenizer(prompt_dir)
    assert out["usage"]["prompt_tokens"] == sum(len(tok("passage: " + t)["input_ids"])
                                                for t in TEXTS)
    r = server.post("/v1/embeddings", {"input": "a", "prompt_name": "doc"})
    assert r.status_code == 400
    assert r.json() == {"error": {
        "message": "Unknown prompt_name 'doc'; this model's prompts are: 'query', "
                   "'passage'.", "type": "BadRequestError", "param": "prompt_name",
        "code": 400}}
    r = server.post("/v1/embeddings", {"input": [1, 2], "prompt": "query: "})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
