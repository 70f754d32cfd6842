"""LoRA adapters behind `vllm serve` (issue 26 A3): `--lora-modules`, the request's `model`
picking the adapter, /v1/models cards, and the runtime load/unload routes."""
from __future__ import annotations

import pytest
import torch

import lora_factory as lf
import model_factory as mf
from servers import Server, _engine
from test_lora import BERT, DECODER
from vllm.entrypoints.openai.cli_args import engine_args_from_namespace, parse_serve_args
from vllm.entrypoints.openai.lora_args import LoRAModulePath
from vllm.lora.request import LoRARequest

BASE = "qwen3-base"


@pytest.fixture(scope="module")
def adapters(qwen3_embed_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("server_adapters")
    return {name: lf.make_adapter(qwen3_embed_dir, root / name, targets=DECODER, seed=seed,
                                  r=r)
            for name, seed, r in (("a", 1, 4), ("b", 2, 8), ("c", 3, 4), ("big", 4, 16))}


@pytest.fixture(scope="module")
def lora_engine(qwen3_embed_dir):
    engine = _engine(qwen3_embed_dir, enable_lora=True, max_loras=2, max_lora_rank=8)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def static_server(lora_engine, adapters):
    server = Server(lora_engine, served_model_name=[BASE], enable_lora=True, lora_modules=[
        LoRAModulePath("ad-a", adapters["a"]),
        LoRAModulePath("ad-b", adapters["b"], base_model_name="tenant-root")])
    yield server
    server.close()


def _offline(qwen3_embed_dir, adapter_dir, ids) -> torch.Tensor:
    model = lf.peft_model(qwen3_embed_dir, adapter_dir, "base") if adapter_dir else \
        lf._load(qwen3_embed_dir, "base")
    return torch.nn.functional.normalize(lf.run(model, ids)[-1], dim=-1)


def _embed(server, model, text="hello world the quick brown fox"):
    return server.post("/v1/embeddings", {"model": model, "input": text})


def _check_embedding(server, qwen3_embed_dir, model, adapter_dir) -> list[float]:
    resp = _embed(server, model)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model"] == model
    ids = server.post("/tokenize", {"model": BASE, "prompt": "hello world the quick brown fox"}
                      ).json()["tokens"]
    got = torch.tensor(body["data"][0]["embedding"])
    assert (got - _offline(qwen3_embed_dir, adapter_dir, ids)).abs().max() <= 1e-4
    return body["data"][0]["embedding"]


def test_model_field_picks_the_adapter(static_server, qwen3_embed_dir, adapters):
    a = _check_embedding(static_server, qwen3_embed_dir, "ad-a", adapters["a"])
    b = _check_embedding(static_server, qwen3_embed_dir, "ad-b", adapters["b"])
    base = _check_embedding(static_server, qwen3_embed_dir, BASE, None)
    assert a != b and a != base
    resp = _embed(static_server, "ad-nope")
    assert resp.status_code == 404
    assert resp.json()["error"]["type"] == "NotFoundError"
    assert "The model `ad-nope` does not exist." in resp.json()["error"]["message"]


def test_models_lists_the_base_then_one_card_per_adapter(static_server, adapters):
    cards = static_server.client.get("/v1/models").json()["data"]
    assert [c["id"] for c in cards] == [BASE, "ad-a", "ad-b"]
    assert cards[0]["parent"] is None
    assert (cards[1]["root"], cards[1]["parent"]) == (adapters["a"], BASE)
    assert (cards[2]["root"], cards[2]["parent"]) == (adapters["b"], "tenant-root")


def test_runtime_routes_do_not_exist_without_the_variable(static_server, adapters):
    for route in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        resp = static_server.post(route, {"lora_name": "x", "lora_path": adapters["c"]})
        assert resp.status_code == 404, route


def test_static_adapters_leave_the_callers_threads_and_later_engines_exact(
        lora_engine, adapters, bert_cls_dir):
    """The order that once broke the suite on AVX2: a server with `--lora-modules` built on
    this thread (its adapter check set the thread to one OpenMP thread for good), then a
    cross-encoder built here. The thread keeps its count; the scores equal transformers."""
    from vllm import LLM
    before = torch.get_num_threads()
    server = Server(lora_engine, served_model_name=[BASE], enable_lora=True,
                    lora_modules=[LoRAModulePath("ad-a", adapters["a"])])
    try:
        assert torch.get_num_threads() == before
    finally:
        server.close()
    assert torch.get_num_threads() == before
    tok = mf.hf_tokenizer(bert_cls_dir)
    docs = ["Paris is the capital of France.", "the quick brown fox"]
    got = [o.outputs.score for o in LLM(bert_cls_dir).score("capital of France?", docs)]
    for doc, score in zip(docs, got):
        enc = tok("capital of France?", doc)
        want = mf.probs_from_logits(mf.hf_seqcls_logits(bert_cls_dir, enc["input_ids"],
                                                        enc["token_type_ids"])).item()
        assert abs(score - want) < 1e-4


def test_runtime_load_and_unload(lora_engine, qwen3_embed_dir, adapters, monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    server = Server(lora_engine, served_model_name=[BASE], enable_lora=True)
    try:
        load = {"lora_name": "ad-c", "lora_path": adapters["c"]}
        resp = server.post("/v1/load_lora_adapter", load)
        assert resp.status_code == 200
        assert resp.text == "Success: LoRA adapter 'ad-c' added successfully."
        c = _check_embedding(server, qwen3_embed_dir, "ad-c", adapters["c"])
        again = server.post("/v1/load_lora_adapter", load)
        assert again.status_code == 400 and "has already been loaded" in again.text
        swap = server.post("/v1/load_lora_adapter", {**load, "lora_path": adapters["a"],
                                                     "load_inplace": True})
        assert swap.status_code == 200
        assert _check_embedding(server, qwen3_embed_dir, "ad-c", adapters["a"]) != c
        big = server.post("/v1/load_lora_adapter", {"lora_name": "ad-big",
                                                    "lora_path": adapters["big"]})
        assert big.status_code == 500  # upstream's answer to an adapter its engine refuses
        assert big.json()["error"]["message"] == "LoRA rank 16 is greater than max_lora_rank 8."
        missing = server.post("/v1/load_lora_adapter", {"lora_name": "ad-x",
                                                        "lora_path": "/nowhere/x"})
        assert missing.status_code == 404
        assert missing.json()["error"]["message"] == \
            "Loading lora ad-x failed: No adapter found for /nowhere/x"
        assert server.post("/v1/load_lora_adapter", {"lora_name": BASE, "lora_path":
                                                     adapters["a"]}).status_code == 400
        resp = server.post("/v1/unload_lora_adapter", {"lora_name": "ad-c"})
        assert resp.status_code == 200
        assert resp.text == "Success: LoRA adapter 'ad-c' removed successfully."
        gone = server.post("/v1/unload_lora_adapter", {"lora_name": "ad-c"})
        assert gone.status_code == 404 and "cannot be found" in gone.text
        assert _embed(server, "ad-c").status_code == 404
        assert [c["id"] for c in server.client.get("/v1/models").json()["data"]] == [BASE]
        _check_embedding(server, qwen3_embed_dir, BASE, None)  # still serving
    finally:
        server.close()


def test_rerank_under_an_adapter_equals_offline(xlmr_cls_dir, tmp_path):
    from vllm import LLM
    path = lf.make_adapter(xlmr_cls_dir, tmp_path / "ce", kind="seqcls", targets=BERT,
                           modules_to_save=["classifier"], seed=5)
    docs = ["the quick brown fox", "water is blue", "paris london"]
    offline = LLM(xlmr_cls_dir, enable_lora=True).score(
        "which city", docs, lora_request=LoRARequest("ce", 1, path), use_tqdm=False)
    engine = _engine(xlmr_cls_dir, enable_lora=True)
    server = Server(engine, served_model_name=["xlmr"], enable_lora=True,
                    lora_modules=[LoRAModulePath("ce", path)])
    try:
        body = server.post("/rerank", {"model": "ce", "query": "which city",
                                       "documents": docs}).json()
        assert body["model"] == "ce"
        got = {r["index"]: r["relevance_score"] for r in body["results"]}
        for i, out in enumerate(offline):
            assert got[i] == pytest.approx(out.outputs.score, abs=1e-5)
    finally:
        server.close()
        engine.shutdown()


def test_serve_flags_parse_like_upstream(qwen3_embed_dir):
    args = parse_serve_args([qwen3_embed_dir, "--enable-lora", "--max-loras", "2",
                             "--max-lora-rank", "8", "--max-cpu-loras", "3",
                             "--lora-modules", "a=/adapters/a",
                             '{"name": "b", "path": "/adapters/b", "base_model_name": "m"}'])
    assert args.lora_modules == [LoRAModulePath("a", "/adapters/a"),
                                 LoRAModulePath("b", "/adapters/b", "m")]
    engine_args = engine_args_from_namespace(args)
    assert (engine_args.enable_lora, engine_args.max_loras, engine_args.max_lora_rank,
            engine_args.max_cpu_loras) == (True, 2, 8, 3)
    with pytest.raises(SystemExit):
        parse_serve_args([qwen3_embed_dir, "--lora-modules", '{"name": "b", "oops": 1}'])


def test_start_up_refuses_bad_lora_settings(lora_engine, adapters):
    from types import SimpleNamespace

    from vllm.entrypoints.openai.api_server import build_app
    with pytest.raises(ValueError, match="--lora-modules needs --enable-lora"):
        build_app(lora_engine, SimpleNamespace(lora_modules=[LoRAModulePath("a", "/x")]))
    with pytest.raises(ValueError, match="--lora-modules big=.*LoRA rank 16 is greater"):
        build_app(lora_engine, SimpleNamespace(enable_lora=True, lora_modules=[
            LoRAModulePath("big", adapters["big"])]))
