"""Data parallel replicas warm up at start-up (issue 38 item 5): each replica runs the
warm-up in its own process before it reports ready, so `DPAsyncLLM.start` (and with it the
server's first 200 on /health) returns only once every replica is warm; its counters then
start again from zero. `--no-warmup` reaches the replicas too."""
from __future__ import annotations

import types

from dp_helpers import metric
from servers import Server
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.openai.api_server import warm_up_engine
from vllm.scaleout.dp_engine import DPAsyncLLM


def _start(model: str, capfd, **args) -> tuple[DPAsyncLLM, str]:
    """Two mp replicas; what their processes logged while starting."""
    capfd.readouterr()
    engine = DPAsyncLLM.start(EngineArgs.from_kwargs(model), 2, "mp",
                              types.SimpleNamespace(**args))
    return engine, capfd.readouterr().out


def test_every_replica_warms_up_before_ready_and_counts_from_zero(qwen3_embed_dir, capfd,
                                                                 caplog):
    engine, logged = _start(qwen3_embed_dir, capfd)
    server = None
    try:
        for index in (0, 1):  # logged by the replica, before it reported ready
            assert f"Replica {index}: Warm-up: 2 batch(es) of 2 prompts (encode, embed)" \
                in logged, logged[-3000:]
        warm_up_engine(engine, types.SimpleNamespace())  # the server's step: a log line only
        assert "each data parallel replica warmed itself up" in caplog.text
        server = Server(engine, served_model_name="m")
        assert server.client.get("/health").json()["replicas_up"] == 2
        text = server.client.get("/metrics").text
        for name in ("vllm:engine_steps_total", "vllm:request_success_total",
                     "vllm:prompt_tokens_total"):
            assert metric(text, name) == {"0": 0.0, "1": 0.0}, (name, metric(text, name))
        assert server.post("/v1/embeddings", {"input": ["a", "b", "c"]}).status_code == 200
        text = server.client.get("/metrics").text
        assert sum(metric(text, "vllm:request_success_total").values()) == 3
    finally:
        if server is not None:
            server.close()
        engine.shutdown()


def test_no_warmup_reaches_the_replicas(qwen3_embed_dir, capfd):
    engine, logged = _start(qwen3_embed_dir, capfd, no_warmup=True)
    try:
        assert "Warm-up:" not in logged
        assert engine.is_alive and engine.health_report()["replicas_up"] == 2
    finally:
        engine.shutdown()
