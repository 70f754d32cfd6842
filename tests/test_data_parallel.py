"""`--data-parallel-size 2 --data-parallel-backend mp`: two engine processes behind one
server answer every route exactly as one engine does; prefix-aware routing sends a shared
prefix to the replica that cached it (its cache-hit counter proves it); killing a replica
under load loses no request, and the replica comes back."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

import model_factory as mf
from dp_helpers import (CLASSIFY_REQUESTS, EMBED_REQUESTS, compare_routes, dp_server,
                        load_and_kill, metric, wait_replicas_up)
from vllm.engine.prompt_types import TextPrompt
from vllm.pooling_params import PoolingParams


@pytest.fixture(scope="module")
def single(qwen3_embed_dir):
    yield from dp_server(qwen3_embed_dir, 0, "mp")


@pytest.fixture(scope="module")
def dp(qwen3_embed_dir):
    yield from dp_server(qwen3_embed_dir, 2, "mp")


def test_every_route_matches_one_replica(single, dp):
    compare_routes(single, dp, EMBED_REQUESTS)
    health = dp.client.get("/health")
    assert health.status_code == 200
    assert health.json() == {"replicas": 2, "replicas_up": 2, "backend": "mp"}


def test_classifier_routes_match_one_replica(qwen3_cls_dir):
    servers = [dp_server(qwen3_cls_dir, n, "mp") for n in (0, 2)]
    single_cls, dp_cls = (next(s) for s in servers)
    try:
        compare_routes(single_cls, dp_cls, CLASSIFY_REQUESTS)
    finally:
        for s in servers:
            next(s, None)


def test_prefix_aware_routing_hits_the_cache(dp, qwen3_embed_dir):
    tok = mf.hf_tokenizer(qwen3_embed_dir)
    prefix = mf.text_of_length(tok, 70, seed=11)
    cached = 16 * (len(tok(prefix)["input_ids"]) // 16)  # full blocks of the shared prefix
    before = metric(dp.client.get("/metrics").text, "vllm:prefix_cache_hits_total")
    routed = dp.engine.router.prefix_routed
    words = ["cat", "dog", "house", "river", "music", "paper"]
    for word in words:
        assert dp.post("/v1/embeddings", {"input": f"{prefix} {word}"}).status_code == 200
    after = metric(dp.client.get("/metrics").text, "vllm:prefix_cache_hits_total")
    gained = {r: after[r] - before.get(r, 0.0) for r in after}
    assert set(after) == {"0", "1"}
    # every repeat went to the first request's replica and found the prefix there
    assert sorted(gained.values()) == [0.0, (len(words) - 1) * cached]
    assert dp.engine.router.prefix_routed - routed == len(words) - 1


def test_metrics_have_a_replica_label(dp):
    dp.post("/v1/embeddings", {"input": ["a", "b", "c", "d"]})
    text = dp.client.get("/metrics").text
    finished = metric(text, "vllm:request_success_total")
    assert set(finished) == {"0", "1"} and sum(finished.values()) >= 4
    assert 'vllm:num_requests_running{model_name="m",replica="0"}' in text


def test_cancelled_requests_are_aborted_on_their_replica(dp, qwen3_embed_dir):
    engine = dp.engine
    long_text = "word " * 500
    n = 120

    async def run() -> int:
        params = PoolingParams(task="embed")
        futures = [engine.submit(TextPrompt(f"{i} {long_text}"), params.clone(), f"c-{i}")
                   for i in range(n)]
        done, _ = await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
        for f in futures:
            f.cancel()
        await asyncio.sleep(1.0)
        await engine.refresh_stats()
        return len(done)

    before = sum(s.num_requests_finished for s in _stats(dp).values())
    asyncio.run_coroutine_threadsafe(run(), _loop(dp)).result(120)
    stats = engine.stats
    assert sum(s.num_requests_finished for s in stats.values()) - before < n
    assert all(s.num_running == 0 and s.num_waiting == 0 for s in stats.values())
    assert engine._loads == [0, 0] and not engine._flights


def test_killing_a_replica_under_load_loses_no_request(single, dp, qwen3_embed_dir):
    texts = [f"request {i}: " + mf.text_of_length(mf.hf_tokenizer(qwen3_embed_dir), 120, i)
             for i in range(48)]
    reference = [r.json()["data"][0]["embedding"]
                 for r in (single.post("/v1/embeddings", {"input": t}) for t in texts)]
    responses = load_and_kill(dp, dp.engine, texts)
    assert [r.status_code for r in responses] == [200] * len(texts)
    for r, ref in zip(responses, reference):
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], ref, atol=2e-6)
    assert dp.engine.retried > 0  # some requests were in flight on the killed replica
    assert wait_replicas_up(dp, 2)["replicas_up"] == 2
    assert dp.engine.restarts == 1
    assert dp.post("/v1/embeddings", {"input": texts[0]}).status_code == 200


def _loop(server) -> asyncio.AbstractEventLoop:
    return server.engine._loop


def _stats(server) -> dict:
    asyncio.run_coroutine_threadsafe(server.engine.refresh_stats(), _loop(server)).result(30)
    return server.engine.stats


def test_cli_serve_dp2_drains_on_sigterm(qwen3_embed_dir, tmp_path):
    """`vllm serve MODEL -dp 2` end to end: SIGTERM while requests are in flight answers
    every one of them, then exits 0."""
    import signal
    import socket
    import subprocess
    import sys
    import time

    import httpx
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve",
                             qwen3_embed_dir, "--port", str(port), "-dp", "2",
                             "--disable-uvicorn-access-log"], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)

        async def load() -> list:
            async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                sent = [asyncio.ensure_future(http.post(
                    "/v1/embeddings", json={"input": [f"{i} " + "word " * 60] * 8}))
                    for i in range(24)]
                await asyncio.sleep(0.3)
                proc.send_signal(signal.SIGTERM)
                return await asyncio.gather(*sent)
        assert [r.status_code for r in asyncio.run(load())] == [200] * 24
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
