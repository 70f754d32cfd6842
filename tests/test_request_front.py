"""The request fronts (LLM, the server) check a request once and hand the engine immutable
prompts: PoolingParams.verify runs once per request on either front, and a TokenizedPrompt
cannot be patched after it is built."""
from __future__ import annotations

import dataclasses

import pytest
from servers import Server, _engine

from vllm.engine.prompt_types import TokenizedPrompt
from vllm.pooling_params import PoolingParams


def _count_fills(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = PoolingParams._fill_from_model

    def counting(self, task, model_config):
        calls.append(task)
        return real(self, task, model_config)
    monkeypatch.setattr(PoolingParams, "_fill_from_model", counting)
    return calls


def test_offline_front_verifies_each_request_once(shared_llm, minilm_dir, monkeypatch):
    llm = shared_llm(minilm_dir)
    calls = _count_fills(monkeypatch)
    outs = llm.embed(["one", "two", "three"], pooling_params=PoolingParams(dimensions=None))
    # once for the call's shared params, as on the server (it was once per prompt)
    assert len(outs) == 3 and calls == ["embed"]


def test_server_front_verifies_each_request_once(minilm_dir, monkeypatch):
    server = Server(_engine(minilm_dir))
    try:
        calls = _count_fills(monkeypatch)
        resp = server.post("/v1/embeddings", {"input": ["one", "two", "three"]})
        assert resp.status_code == 200 and len(resp.json()["data"]) == 3
        assert calls == ["embed"]  # once, at the front, for the request's shared params
    finally:
        server.close()


def test_params_verified_for_another_model_are_checked_again(shared_llm, minilm_dir,
                                                            monkeypatch):
    params = PoolingParams()
    params.verify("embed", shared_llm(minilm_dir).llm_engine.model_config)
    calls = _count_fills(monkeypatch)
    shared_llm(minilm_dir).embed(["x"], pooling_params=params)
    assert calls == ["embed"]


def test_a_tokenized_prompt_is_immutable():
    p = TokenizedPrompt([101, 7, 102])
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.cache_salt = "tenant"  # type: ignore[misc]
    salted = dataclasses.replace(p, cache_salt="tenant")
    assert (p.cache_salt, salted.cache_salt) == (None, "tenant")


# (an unknown precision never reaches the check on the server: its schema refuses it)
BAD_OPTIONS = [({"precision": "float32", "ranges": [[0.0], [1.0]]}, "ranges"),
               ({"sparse": True}, "sparse"),           # MiniLM is no SPLADE model
               ({"precision": "int8"}, "precision")]   # no ranges and no calibration file


@pytest.mark.parametrize("options,param", BAD_OPTIONS)
def test_embedding_output_options_are_checked_alike_on_both_fronts(shared_llm, minilm_dir,
                                                                    options, param):
    """One check (vllm.entrypoints.embed_options): the same words offline (ValueError) and
    on /v1/embeddings (a 400 naming the field)."""
    with pytest.raises(ValueError) as offline:
        shared_llm(minilm_dir).embed(["a text"], use_tqdm=False, **options)
    server = Server(_engine(minilm_dir))
    try:
        resp = server.post("/v1/embeddings", {"input": ["a text"], **options})
    finally:
        server.close()
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["param"], error["message"]) == (param, str(offline.value))


def test_both_engines_are_engine_clients():
    """The server types its engine (EngineClient) instead of probing it: every member of
    the protocol exists on AsyncLLM and on the data-parallel front."""
    from vllm.engine.async_llm import AsyncLLM
    from vllm.engine.protocol import EngineClient
    from vllm.scaleout.dp_engine import DPAsyncLLM
    members = [m for m in dir(EngineClient) if not m.startswith("_")]
    members += list(EngineClient.__annotations__)
    instance_data = {"model_config", "processor"}  # set in __init__
    for cls in (AsyncLLM, DPAsyncLLM):
        missing = [m for m in members if m not in instance_data and not hasattr(cls, m)]
        assert missing == [], (cls.__name__, missing)
    assert AsyncLLM.supports_lora and not DPAsyncLLM.supports_lora
    with pytest.raises(ValueError, match="not supported with data parallel replicas"):
        DPAsyncLLM.check_lora(None, None)


def test_the_offline_engine_is_an_engine_core():
    """The offline LLM and AsyncLLM submit to the synchronous EngineCore protocol, which
    LLMEngine implements member by member."""
    from vllm.engine.llm_engine import LLMEngine
    from vllm.engine.protocol import EngineCore
    members = [m for m in dir(EngineCore) if not m.startswith("_")]
    members += list(EngineCore.__annotations__)
    missing = [m for m in members if m not in {"model_config", "processor"}
               and not hasattr(LLMEngine, m)]
    assert missing == []


def test_a_single_engine_answers_the_protocol(minilm_dir):
    import asyncio
    engine = _engine(minilm_dir)
    assert engine.health_report() is None and engine.replica_stats() == {}
    asyncio.run(engine.refresh_stats())
    assert engine.stats.num_steps >= 0
