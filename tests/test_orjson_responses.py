"""Responses are serialized with orjson, as upstream 0.33 serves them (issue 38 item 3):
compact UTF-8 JSON, floats as numbers, NaN and infinities as null, error bodies included;
what orjson refuses falls back to an equal JSON body, never a 500."""
from __future__ import annotations

import json
import math

import orjson
import pytest

from vllm.entrypoints.openai.errors import error_bytes, json_bytes
from vllm.entrypoints.openai.responses import (EmbeddingResponse, EmbeddingResponseData,
                                               ScoreResponse, ScoreResponseData, UsageInfo)
from vllm.entrypoints.openai.serving_engine import json_response


def _scores(values: list[float]) -> ScoreResponse:
    return ScoreResponse(id="score-1", model="m", created=1, usage=UsageInfo.of(3),
                         data=[ScoreResponseData(index=i, score=v)
                               for i, v in enumerate(values)])


def test_a_model_is_orjson_of_its_dump_with_the_json_pydantic_writes():
    body = EmbeddingResponse(id="embd-1", model="m", created=1, usage=UsageInfo.of(2), data=[
        EmbeddingResponseData(index=0, embedding=[0.1, -2.5e-7, 1 / 3, 0.0]),
        EmbeddingResponseData(index=1, embedding={7: 0.5, 12: 1.25})])  # sparse: int keys
    got = json_bytes(body)
    assert got == orjson.dumps(body.model_dump(), option=orjson.OPT_NON_STR_KEYS)
    assert json.loads(got) == json.loads(body.model_dump_json())
    assert b" " not in got  # compact, as upstream


def test_nan_and_infinity_are_null_as_upstream():
    got = json.loads(json_response(_scores([0.5, math.nan, math.inf, -math.inf])).body)
    assert [d["score"] for d in got["data"]] == [0.5, None, None, None]
    assert json.loads(json_bytes({"x": math.nan})) == {"x": None}


def test_what_orjson_refuses_falls_back_to_equal_json():
    surrogate = {"message": "bad \ud800 text"}
    assert json.loads(json_bytes(surrogate)) == surrogate  # escaped by the stdlib
    assert json.loads(json_bytes({"n": 2**70})) == {"n": 2**70}
    model = _scores([1.0]).model_copy(update={"id": "score-\ud800"})
    assert json.loads(json_bytes(model))["id"] == "score-\ud800"


def test_error_bytes_are_the_error_envelope():
    got = error_bytes(413, "too large – ü", None, detail="x")
    assert json.loads(got) == {"error": {"message": "too large – ü",
                                         "type": "PayloadTooLargeError", "param": None,
                                         "code": 413}, "detail": "x"}
    assert "ü".encode() in got  # UTF-8, not \\u escapes


@pytest.mark.parametrize("path,body", [
    ("/v1/embeddings", {"input": ["a text", "another"]}),
    ("/tokenize", {"prompt": "hello"}),
    ("/v1/embeddings", {"input": "x", "model": "no-such-model"}),  # an error body
])
def test_served_bodies_are_orjson(minilm, path, body):
    r = minilm.post(path, body)
    assert r.headers["content-type"] == "application/json"
    assert r.content == orjson.dumps(r.json())  # orjson's exact bytes, compact


def test_plain_routes_answer_through_orjson(minilm):
    r = minilm.client.get("/version")
    assert r.status_code == 200 and r.content == orjson.dumps(r.json())
    r = minilm.client.get("/no/such/route")
    assert r.status_code == 404 and r.content == orjson.dumps(r.json())
