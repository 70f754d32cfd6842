"""Issue 26 B: several models behind one server. Each model answers as it would alone;
requests are routed by `model`; /v1/models, /metrics and /health cover every model."""
from __future__ import annotations

import threading
import time
import types

import httpx
import pytest

import model_factory as mf
from servers import _engine
from vllm.entrypoints.openai.api_server import bind_socket, build_app, make_server
from vllm.entrypoints.openai.model_memory import ModelMemory, check_fits, estimate
from vllm.entrypoints.openai.multi_model import ModelRouter, merge_metrics
from vllm.entrypoints.openai.multi_server import model_namespaces


def _ns(**kw):
    return types.SimpleNamespace(uvicorn_log_level="warning", disable_uvicorn_access_log=True,
                                 **kw)


@pytest.fixture(scope="module")
def two_models(bert_embed_dir, bert_cls_dir):
    engines = [_engine(bert_embed_dir), _engine(bert_cls_dir)]
    router = ModelRouter([(["embedder"], build_app(engines[0], _ns(served_model_name=[
        "embedder"]))), (["reranker"], build_app(engines[1], _ns(served_model_name=[
            "reranker"])))])
    sock = bind_socket("127.0.0.1", 0)
    server = make_server(router, _ns())
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    client = httpx.Client(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=60)
    yield client, engines
    client.close()
    server.should_exit = True
    thread.join(15)
    for engine in engines:
        engine.shutdown()


def test_requests_are_routed_by_model(two_models, bert_embed_dir, bert_cls_dir):
    client, _ = two_models
    tok = mf.hf_tokenizer(bert_embed_dir)
    r = client.post("/v1/embeddings", json={"input": "hello there", "model": "embedder"})
    assert r.status_code == 200 and r.json()["model"] == "embedder"
    ref = mf.hf_embedding(bert_embed_dir, tok("hello there")["input_ids"], "CLS")
    assert mf.cosine(r.json()["data"][0]["embedding"], ref) > 0.99999
    default = client.post("/v1/embeddings", json={"input": "hello there"})  # no model: first
    assert default.json()["data"] == r.json()["data"]
    s = client.post("/score", json={"model": "reranker", "text_1": "a", "text_2": "b c"})
    assert s.status_code == 200 and s.json()["model"] == "reranker"
    enc = mf.hf_tokenizer(bert_cls_dir)("a", "b c")
    want = float(mf.probs_from_logits(mf.hf_seqcls_logits(
        bert_cls_dir, enc["input_ids"], enc["token_type_ids"])))
    assert s.json()["data"][0]["score"] == pytest.approx(want, abs=1e-5)
    # Each model keeps its own routes: the reranker has no embeddings, the embedder no /classify.
    assert client.post("/v1/embeddings", json={"input": "x", "model": "reranker"}
                       ).status_code == 404
    unknown = client.post("/v1/embeddings", json={"input": "x", "model": "gpt-4"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == ("The model `gpt-4` does not exist. This "
                                                  "server serves: embedder, reranker.")
    bad = client.post("/v1/embeddings", content=b"{not json",
                      headers={"content-type": "application/json"})
    assert bad.status_code == 400


def test_models_metrics_and_health_cover_every_model(two_models, bert_embed_dir,
                                                     bert_cls_dir):
    client, engines = two_models
    cards = client.get("/v1/models").json()["data"]
    assert [(c["id"], c["root"]) for c in cards] == [("embedder", bert_embed_dir),
                                                     ("reranker", bert_cls_dir)]
    client.post("/v1/embeddings", json={"input": "m", "model": "embedder"})
    text = client.get("/metrics").text
    assert 'model_name="embedder"' in text and 'model_name="reranker"' in text
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(families) == len(set(families))  # each family once
    assert client.get("/health").status_code == 200
    assert client.get("/version").status_code == 200


def test_merge_metrics_labels_and_groups():
    a = "# HELP x_total X\n# TYPE x_total counter\nx_total{route=\"/a\"} 1.0\n"
    b = "# HELP x_total X\n# TYPE x_total counter\nx_total{route=\"/a\"} 2.0\ny 3\n"
    merged = merge_metrics([("m1", a), ("m2", b)])
    assert merged.count("# TYPE x_total counter") == 1
    assert 'x_total{model_name="m1",route="/a"} 1.0' in merged
    assert 'x_total{model_name="m2",route="/a"} 2.0' in merged
    assert 'y{model_name="m2"} 3' in merged


def test_memory_is_checked_before_loading(bert_embed_dir, qwen3_embed_dir):
    from vllm.engine.arg_utils import EngineArgs
    bert = estimate("bert", EngineArgs.from_kwargs(bert_embed_dir).create_engine_config())
    qwen = estimate("qwen", EngineArgs.from_kwargs(
        qwen3_embed_dir, max_num_seqs=4).create_engine_config())
    assert bert.kv_cache == 0 and bert.weights > 0  # bidirectional: no K/V kept
    # Qwen3 tiny: 2 layers x 2 (K, V) x 2 kv heads x 32 dims x 4 bytes per token
    assert qwen.kv_cache == 4 * 512 * 2 * 2 * 2 * 32 * 4
    check_fits([bert, qwen], available=10 * 2 ** 30)
    with pytest.raises(SystemExit, match="need about .* MiB together"):
        check_fits([bert, qwen, ModelMemory("big", 2 ** 40, 0)], available=10 * 2 ** 30)


def test_served_names_pair_with_models():
    args = types.SimpleNamespace(served_model_name=["a", "b"], model=None, model_tag=None)
    spaces = model_namespaces(args, ["/m1", "/m2"])
    assert [(s.model_tag, s.served_model_name) for s in spaces] == [("/m1", ["a"]),
                                                                    ("/m2", ["b"])]
    with pytest.raises(SystemExit, match="2 models need 2 --served-model-name"):
        model_namespaces(types.SimpleNamespace(served_model_name=["a"]), ["/m1", "/m2"])


def test_cli_serves_two_models(bert_embed_dir, bert_cls_dir):
    """`vllm serve A B --served-model-name a b`: both served on one port, each model's
    memory logged before loading, SIGTERM stops both engines (exit 0)."""
    import os
    from test_server import _start_cli, stop_cli
    proc, url, log = _start_cli(
        ["vllm.entrypoints.cli.main", "serve", bert_embed_dir, bert_cls_dir, "--port", "0",
         "--served-model-name", "emb", "rer", "--disable-uvicorn-access-log"],
        {**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            assert [c["id"] for c in http.get("/v1/models").json()["data"]] == ["emb", "rer"]
            assert http.post("/v1/embeddings", json={"input": "a", "model": "emb"}
                             ).status_code == 200
            assert http.post("/rerank", json={"query": "a", "documents": ["b"],
                                              "model": "rer"}).status_code == 200
        stop_cli(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(log)
    assert "Model emb: weights" in text and "Model rer: weights" in text
    assert "Server stopped" in text
