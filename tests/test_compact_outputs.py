"""Compact outputs: upstream's encoding_format / embed_dtype / endianness, sentence-transformers'
quantized `precision`, and identical inputs computed once.

References are computed independently: numpy's own float16 and a hand-rounded bfloat16 from
the float32 bits; `sentence_transformers.quantization.quantize_embeddings` on the server's
float embeddings; the engine's computed-token counter for deduplication.
"""
from __future__ import annotations

import base64
import json
import warnings

import numpy as np
import pytest
import torch

import model_factory as mf
from servers import _model_server
from test_server import _ok
from vllm import LLM

TEXTS = ["Hello world", "The quick brown fox", "a"]


@pytest.fixture(scope="module")
def server(bert_st_dense_dir):
    yield from _model_server(bert_st_dense_dir)


def _floats(server) -> np.ndarray:
    out = _ok(server.post("/v1/embeddings", {"input": TEXTS}))
    return np.array([d["embedding"] for d in out["data"]], dtype=np.float32)


def _bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even, by integer arithmetic."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def _quantize_reference(floats: np.ndarray, precision: str, ranges=None) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers.quantization import quantize_embeddings
    return quantize_embeddings(floats, precision=precision, ranges=ranges)


def test_base64_dtypes_and_endianness(server):
    ref = _floats(server)
    cases = {("float32", "little"): ref.astype("<f4").view(np.uint8),
             ("float16", "big"): ref.astype(">f2").view(np.uint8),
             ("bfloat16", "big"): _bfloat16_bits(ref).astype(">u2").view(np.uint8),
             ("bfloat16", "little"): _bfloat16_bits(ref).astype("<u2").view(np.uint8)}
    for (dtype, order), expected in cases.items():
        out = _ok(server.post("/v1/embeddings", {"input": TEXTS, "encoding_format": "base64",
                                                 "embed_dtype": dtype, "endianness": order}))
        got = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), np.uint8)
                        for d in out["data"]])
        assert np.array_equal(got, expected.reshape(len(TEXTS), -1)), (dtype, order)
    native = _ok(server.post("/v1/embeddings", {"input": TEXTS, "encoding_format": "base64"}))
    assert np.array_equal(np.frombuffer(base64.b64decode(native["data"][0]["embedding"]),
                                        np.float32), ref[0])  # the OpenAI client's default


def test_bytes_and_bytes_only_bodies(server, bert_st_dense_dir):
    ref = _floats(server)
    tok = mf.hf_tokenizer(bert_st_dense_dir)
    n_tokens = sum(len(tok(t)["input_ids"]) for t in TEXTS)
    r = server.post("/v1/embeddings", {"input": TEXTS, "encoding_format": "bytes",
                                       "embed_dtype": "float16", "endianness": "little"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    meta = json.loads(r.headers["metadata"])
    assert set(meta) == {"id", "created", "model", "data", "usage"}
    assert meta["id"].startswith("embd-") and meta["usage"] == {"prompt_tokens": n_tokens,
                                                                "total_tokens": n_tokens}
    width = ref.shape[1] * 2
    assert meta["data"] == [{"index": i, "embed_dtype": "float16", "endianness": "little",
                             "start": i * width, "end": (i + 1) * width,
                             "shape": [ref.shape[1]]} for i in range(len(TEXTS))]
    assert r.content == ref.astype("<f2").tobytes()
    only = server.post("/pooling", {"input": TEXTS, "encoding_format": "bytes_only"})
    assert only.status_code == 200 and "metadata" not in only.headers
    raw = _ok(server.post("/pooling", {"input": TEXTS}))  # the pre-Dense pooled state
    assert only.content == np.array([d["data"] for d in raw["data"]], "<f4").tobytes()


@pytest.mark.parametrize("dtype,torch_dtype", [("fp8_e4m3", "float8_e4m3fn"),
                                               ("fp8_e5m2", "float8_e5m2")])
def test_fp8_embed_dtypes_one_byte_per_value(server, dtype, torch_dtype):
    """Upstream's fp8 encodings on base64, bytes and bytes_only: torch's fp8 bit patterns of
    the float32 embedding, one byte each (endianness changes nothing)."""
    ref = _floats(server)
    expected = torch.from_numpy(ref).to(getattr(torch, torch_dtype)).view(torch.uint8).numpy()
    out = _ok(server.post("/v1/embeddings", {"input": TEXTS, "encoding_format": "base64",
                                             "embed_dtype": dtype, "endianness": "big"}))
    got = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), np.uint8)
                    for d in out["data"]])
    assert np.array_equal(got, expected)
    for fmt in ("bytes", "bytes_only"):
        r = server.post("/v1/embeddings", {"input": TEXTS, "encoding_format": fmt,
                                           "embed_dtype": dtype})
        assert r.status_code == 200 and r.content == expected.tobytes()
        if fmt == "bytes":
            meta = json.loads(r.headers["metadata"])
            assert [d["embed_dtype"] for d in meta["data"]] == [dtype] * len(TEXTS)
            assert meta["data"][1]["start"] == ref.shape[1]
    # decoded, within fp8's precision of the float32 values
    decoded = torch.from_numpy(got.copy()).view(getattr(torch, torch_dtype)).float().numpy()
    assert np.allclose(decoded, ref, rtol=0.13, atol=1e-3)


@pytest.mark.parametrize("precision", ["binary", "ubinary", "int8", "uint8"])
def test_precision_matches_quantize_embeddings(server, precision):
    ref = _floats(server)
    body = {"input": TEXTS, "precision": precision}
    ranges = None
    if precision.endswith("int8"):
        ranges = np.stack([ref.min(axis=0) - 0.01, ref.max(axis=0) + 0.01])
        body["ranges"] = ranges.tolist()
    expected = _quantize_reference(ref, precision, ranges)
    out = _ok(server.post("/v1/embeddings", body))
    assert np.array_equal(np.array([d["embedding"] for d in out["data"]]), expected)
    packed = _ok(server.post("/v1/embeddings", {**body, "encoding_format": "base64"}))
    raw = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), expected.dtype)
                    for d in packed["data"]])
    assert np.array_equal(raw, expected)


def test_precision_bad_input(server):
    r = server.post("/v1/embeddings", {"input": "a", "precision": "int8"})
    assert r.status_code == 400
    assert r.json() == {"error": {
        "message": "precision 'int8' needs calibration ranges: pass `ranges` ([[min per "
                   "dimension], [max per dimension]]) or start the server with "
                   "--embedding-calibration FILE.",
        "type": "BadRequestError", "param": "precision", "code": 400}}
    r = server.post("/v1/embeddings", {"input": "a", "precision": "binary",
                                       "embed_dtype": "float16"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "embed_dtype"
    r = server.post("/v1/embeddings", {"input": "a", "endianness": "middle"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"


@pytest.mark.parametrize("field,bad", [("encoding_format", "base65"),
                                       ("embed_dtype", "float64"), ("endianness", "middle")])
def test_a_bad_literal_names_the_error_type_and_the_value(server, field, bad):
    """As upstream's message does: pydantic's `literal_error` and the value given."""
    r = server.post("/v1/embeddings", {"input": "a", field: bad})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == field
    assert "Input should be" in error["message"] and "literal_error" in error["message"]
    assert f"got {bad!r}" in error["message"]


def test_llm_precision_with_calibration_file(bert_st_dense_dir, tmp_path):
    calib = np.random.default_rng(0).normal(scale=0.2, size=(64, 32)).astype(np.float32)
    path = tmp_path / "calibration.npy"
    np.save(path, calib)
    llm = LLM(model=bert_st_dense_dir, embedding_calibration=str(path))
    floats = np.array([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)],
                      dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers.quantization import quantize_embeddings
    expected = quantize_embeddings(floats, "uint8", calibration_embeddings=calib)
    got = llm.embed(TEXTS, precision="uint8", use_tqdm=False)
    assert np.array_equal(np.array([o.outputs.embedding for o in got]), expected)
    with pytest.raises(ValueError, match="precision must be one of"):
        llm.embed(TEXTS, precision="int4", use_tqdm=False)


def test_duplicates_are_computed_once(shared_llm, bert_embed_dir):
    llm = shared_llm(bert_embed_dir)
    tok = mf.hf_tokenizer(bert_embed_dir)
    texts = ["red fox", "blue sky today", "red fox", "red fox", "blue sky today", "one"]
    unique = sum(len(tok(t)["input_ids"]) for t in dict.fromkeys(texts))
    before = llm.llm_engine.stats
    outs = llm.embed(texts, use_tqdm=False)
    after = llm.llm_engine.stats
    assert after.computed_tokens - before.computed_tokens == unique
    assert after.num_deduplicated - before.num_deduplicated == 3
    assert [o.prompt_token_ids for o in outs] == [tok(t)["input_ids"] for t in texts]
    assert outs[0].outputs.embedding == outs[2].outputs.embedding == outs[3].outputs.embedding
    alone = llm.embed(["red fox"], use_tqdm=False)[0].outputs.embedding
    np.testing.assert_allclose(outs[0].outputs.embedding, alone, atol=1e-6)


def test_duplicates_in_one_http_request(server, bert_st_dense_dir):
    tok = mf.hf_tokenizer(bert_st_dense_dir)
    texts = ["same text here", "other", "same text here"]
    stats = server.engine.stats
    out = _ok(server.post("/v1/embeddings", {"input": texts}))
    computed = server.engine.stats.computed_tokens - stats.computed_tokens
    assert computed == sum(len(tok(t)["input_ids"]) for t in texts[:2])
    assert out["usage"]["prompt_tokens"] == sum(len(tok(t)["input_ids"]) for t in texts)
    assert out["data"][0]["embedding"] == out["data"][2]["embedding"]
