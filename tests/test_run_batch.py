"""`vllm run-batch`: upstream's batch-file format answered by the real server app,
compared with `LLM.embed` / `LLM.score` run independently on the same texts."""
from __future__ import annotations

import json

import numpy as np
import pytest

from vllm.entrypoints.cli.main import main

QUERY = "What is the capital of France?"
DOCS = ["Paris is in France.", "Bananas are yellow", "x"]
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog", "a", "prefix cache"]


def _write(path, lines) -> str:
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n"
                            for ln in lines))
    return str(path)


def _read(path) -> list[dict]:
    return [json.loads(ln) for ln in open(path)]


def _req(cid: str, url: str, body: dict) -> dict:
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def _run(*argv: str) -> None:
    assert main(["run-batch", *argv]) == 0


def _embed_lines() -> list:
    lines = [_req(f"e{i}", "/v1/embeddings", {"model": "m", "input": t})
             for i, t in enumerate(TEXTS)]
    lines.insert(1, "{not json")
    lines.insert(3, _req("bad-url", "/v1/chat/completions", {"model": "m"}))
    lines.insert(4, _req("bad-body", "/v1/embeddings", {"model": "m", "input": []}))
    lines.insert(5, _req("bad-model", "/pooling", {"model": "nope", "input": "a"}))
    return lines


def test_embeddings_errors_and_order(tmp_path, minilm_dir, shared_llm):
    src = _write(tmp_path / "in.jsonl", _embed_lines())
    out = tmp_path / "out.jsonl"
    _run("-i", src, "-o", str(out), "--model", minilm_dir, "--served-model-name", "m",
         "--max-concurrency", "1")
    got = _read(out)
    assert [g["custom_id"] for g in got] == ["e0", None, "e1", "bad-url", "bad-body",
                                              "bad-model", "e2", "e3"]
    ok = [g for g in got if g["error"] is None]
    assert [g["response"]["status_code"] for g in ok] == [200] * 4
    llm = shared_llm(minilm_dir)
    for g, text in zip(ok, TEXTS):  # one prompt per engine step on both sides: bit-equal
        body = g["response"]["body"]
        assert body["object"] == "list" and body["model"] == "m"
        assert body["id"].startswith("embd-") and g["id"].startswith("vllm-")
        assert g["response"]["request_id"].startswith("vllm-batch-")
        assert body["data"][0]["embedding"] == llm.embed([text], use_tqdm=False)[0] \
            .outputs.embedding
    errors = {g["custom_id"]: g for g in got if g["error"] is not None}
    assert errors[None]["error"]["code"] == 400 and "not valid JSON" in \
        errors[None]["error"]["message"]
    assert "Supported endpoints" in errors["bad-url"]["error"]["message"]
    assert errors["bad-body"]["response"]["status_code"] == 400
    assert errors["bad-body"]["error"]["param"] == "input"
    assert errors["bad-model"]["response"] == {**errors["bad-model"]["response"],
                                               "status_code": 404, "body": None}
    assert errors["bad-model"]["error"]["type"] == "NotFoundError"


def test_resume_skips_written_lines(tmp_path, minilm_dir):
    lines = _embed_lines()
    src = _write(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    _write(tmp_path / "first.jsonl", lines[:3])
    _run("-i", str(tmp_path / "first.jsonl"), "-o", str(out), "--model", minilm_dir,
         "--served-model-name", "m")
    first = _read(out)
    with open(out, "a") as f:  # a job killed mid-write leaves half a line
        f.write('{"id": "vllm-cut')
    _run("-i", src, "-o", str(out), "--model", minilm_dir, "--served-model-name", "m")
    got = _read(out)
    assert got[:3] == first  # kept as written, not rerun
    assert [g["custom_id"] for g in got] == ["e0", None, "e1", "bad-url", "bad-body",
                                              "bad-model", "e2", "e3"]
    _run("-i", src, "-o", str(out), "--model", minilm_dir, "--served-model-name", "m")
    assert _read(out) == got  # nothing left to do


def test_score_and_rerank_match_llm_score(tmp_path, bert_cls_dir, shared_llm):
    lines = [_req("s", "/score", {"text_1": QUERY, "text_2": DOCS}),
             _req("s1", "/v1/score", {"text_1": QUERY, "text_2": DOCS[0]}),
             _req("r", "/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2}),
             _req("r1", "/v1/rerank", {"query": QUERY, "documents": DOCS}),
             _req("c", "/classify", {"input": DOCS[0]})]
    out = tmp_path / "out.jsonl"
    _run("-i", _write(tmp_path / "in.jsonl", lines), "-o", str(out), "--model", bert_cls_dir)
    got = {g["custom_id"]: g["response"]["body"] for g in _read(out)}
    ref = [o.outputs.score for o in shared_llm(bert_cls_dir).score(QUERY, DOCS,
                                                                     use_tqdm=False)]
    np.testing.assert_allclose([d["score"] for d in got["s"]["data"]], ref, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["s1"]["data"][0]["score"], ref[0], rtol=0, atol=1e-6)
    order = list(np.argsort(ref)[::-1])
    assert [r["index"] for r in got["r"]["results"]] == order[:2]
    assert [r["index"] for r in got["r1"]["results"]] == order
    np.testing.assert_allclose([r["relevance_score"] for r in got["r1"]["results"]],
                               sorted(ref, reverse=True), rtol=0, atol=1e-6)
    assert got["c"]["data"][0]["num_classes"] == 1
