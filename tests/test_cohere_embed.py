"""Cohere's /v2/embed (issue 25 item 5), as upstream 0.32 serves it: `input_type` picks one of
the model's sentence-transformers prompts (none without it), `embedding_types` built from the
same float vectors, `truncate` END / START / NONE, `output_dimension` for Matryoshka models
only, and Cohere's response shape; checked against sentence-transformers and /v1/embeddings."""
from __future__ import annotations

import base64

import numpy as np
import pytest

import model_factory as mf
from test_prompts import prompt_dir, server, st_model  # noqa: F401  (the fixtures)
from test_server import _ok

TEXTS = ["how do cats sleep", "the weather today is sunny and warm"]


def test_float_embeddings_prompt_and_response_shape(server, prompt_dir, st_model):
    out = _ok(server.post("/v2/embed", {"texts": TEXTS, "input_type": "passage"}))
    assert set(out) == {"id", "embeddings", "texts", "meta", "response_type"}
    assert out["response_type"] == "embeddings_by_type" and out["texts"] == TEXTS
    assert list(out["embeddings"]) == ["float"]
    np.testing.assert_allclose(out["embeddings"]["float"],
                               st_model.encode(TEXTS, prompt_name="passage"), atol=1e-5)
    tok = mf.hf_tokenizer(prompt_dir)
    assert out["meta"] == {"api_version": {"version": "2"}, "billed_units": {
        "input_tokens": sum(len(tok("passage: " + t)["input_ids"]) for t in TEXTS),
        "image_tokens": 0}}
    # no input_type: no prompt at all (the model's default_prompt_name does not apply)
    bare = _ok(server.post("/v2/embed", {"texts": TEXTS}))
    np.testing.assert_allclose(bare["embeddings"]["float"], st_model.encode(TEXTS, prompt=""),
                               atol=1e-5)


def test_embedding_types_come_from_the_same_vectors(server):
    out = _ok(server.post("/v2/embed", {
        "texts": TEXTS, "embedding_types": ["float", "binary", "ubinary", "base64"]}))
    floats = np.array(out["embeddings"]["float"], dtype=np.float32)
    ubinary = np.packbits(floats >= 0, axis=-1).astype(np.int16)
    assert out["embeddings"]["ubinary"] == ubinary.tolist()
    assert out["embeddings"]["binary"] == (ubinary - 128).tolist()
    decoded = [np.frombuffer(base64.b64decode(s), dtype="<f4") for s in out["embeddings"]["base64"]]
    np.testing.assert_array_equal(np.stack(decoded), floats)


def _v1(server, **fields) -> np.ndarray:
    out = _ok(server.post("/v1/embeddings", {"input": TEXTS[1], "prompt": "", **fields}))
    return np.array(out["data"][0]["embedding"])


def test_truncate_start_end_none(server):
    def v2(**fields):
        return server.post("/v2/embed", {"texts": [TEXTS[1]], **fields})
    end = np.array(_ok(v2(max_tokens=5))["embeddings"]["float"][0])
    np.testing.assert_allclose(end, _v1(server, truncate_prompt_tokens=5), atol=1e-6)
    start = np.array(_ok(v2(truncate="START", max_tokens=5))["embeddings"]["float"][0])
    np.testing.assert_allclose(start, _v1(server, truncate_prompt_tokens=5,
                                          truncation_side="left"), atol=1e-6)
    assert not np.allclose(start, end, atol=1e-3)
    whole = np.array(_ok(v2(truncate="NONE"))["embeddings"]["float"][0])
    np.testing.assert_allclose(whole, _v1(server), atol=1e-6)
    r = v2(truncate="NONE", max_tokens=3)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(
        "Input of 9 tokens exceeds max_tokens=3 with truncate=NONE.")
    r = v2(texts=["word " * 600], truncate="NONE")
    assert r.status_code == 400
    cut = _ok(server.post("/v1/embeddings", {"input": "word " * 600, "prompt": "",
                                             "truncate_prompt_tokens": -1}))["usage"]
    assert _ok(v2(texts=["word " * 600]))["meta"]["billed_units"]["input_tokens"] == \
        cut["prompt_tokens"]  # END without max_tokens: cut to max_model_len


@pytest.mark.parametrize("body,param,words", [
    ({"texts": TEXTS, "input_type": "doc"}, "input_type",
     "Unsupported input_type 'doc'. Supported values: passage, query"),
    ({"texts": TEXTS, "embedding_types": ["int8"]}, "embedding_types", "literal_error"),
    ({"texts": TEXTS, "output_dimension": 8}, "output_dimension", "matryoshka"),
    ({"texts": []}, "texts", "non-empty list of `texts`"),
    ({"images": ["data:image/png;base64,AAAA"]}, "images", "`images` is not supported"),
    ({"texts": TEXTS, "truncate": "MIDDLE"}, "truncate", "literal_error"),
])
def test_bad_requests_are_400s_naming_the_field(server, body, param, words):
    r = server.post("/v2/embed", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_input_type_on_a_model_without_prompts(minilm):
    r = minilm.post("/v2/embed", {"texts": ["a"], "input_type": "query"})
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        "Unsupported input_type 'query'. This model does not define any input_type task "
        "instructions.")
