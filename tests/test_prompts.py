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


# ----- Pooling include_prompt false: the prompt's tokens are left out of pooling ---------------
def _without_prompt(src: str, dst, pooling: str) -> str:
    path = mf.copy_checkpoint(src, dst)
    conf_path = path / "1_Pooling" / "config.json"
    conf = json.loads(conf_path.read_text())
    conf.update(include_prompt=False, pooling_mode_mean_tokens=pooling == "mean",
                pooling_mode_cls_token=pooling == "cls")
    conf_path.write_text(json.dumps(conf))
    return str(path)


@pytest.fixture(scope="module", params=["mean", "cls"])
def no_prompt_dir(request, prompt_dir, tmp_path_factory):
    return _without_prompt(prompt_dir, tmp_path_factory.mktemp("noprompt") / "m", request.param)


def test_include_prompt_false_matches_sentence_transformers(no_prompt_dir, st_model):
    """MEAN skips the prompt's tokens ([CLS] + the prompt's own); CLS takes the first
    token after them (sentence-transformers 6.2's Pooling); no prompt: nothing skipped."""
    from sentence_transformers import SentenceTransformer
    ref_model = SentenceTransformer(no_prompt_dir, device="cpu")
    assert ref_model[1].include_prompt is False
    llm = LLM(model=no_prompt_dir)
    for kwargs in ({"prompt_name": "query"}, {"prompt": "passage: "}, {}, {"prompt": ""}):
        got = _embeds(llm.embed(TEXTS, use_tqdm=False, **kwargs))
        np.testing.assert_allclose(got, ref_model.encode(TEXTS, **kwargs), atol=1e-5)
    # Not the embedding with the prompt pooled in (st_model: include_prompt true).
    with_prompt = st_model.encode(TEXTS, prompt="passage: ")
    assert np.abs(_embeds(llm.embed(TEXTS, prompt="passage: ", use_tqdm=False))
                  - with_prompt).max() > 1e-3


def test_server_include_prompt_false(prompt_dir, tmp_path):
    from sentence_transformers import SentenceTransformer
    path = _without_prompt(prompt_dir, tmp_path / "m", "mean")
    ref = SentenceTransformer(path, device="cpu").encode(TEXTS, prompt_name="passage")
    for client in _model_server(path):
        out = _ok(client.post("/v1/embeddings", {"input": TEXTS, "prompt_name": "passage"}))
        np.testing.assert_allclose([d["embedding"] for d in out["data"]], ref, atol=1e-5)
