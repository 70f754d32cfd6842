"""`--data-parallel-backend ray`: two Ray actor replicas on a local in-process cluster
(2 CPUs, one per replica) answer every route as one engine does, and killing one actor
under load loses no request."""
from __future__ import annotations

import numpy as np
import pytest
import ray

import model_factory as mf
from dp_helpers import EMBED_REQUESTS, compare_routes, dp_server, load_and_kill, \
    wait_replicas_up


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def single(qwen3_embed_dir):
    yield from dp_server(qwen3_embed_dir, 0, "mp")


@pytest.fixture(scope="module")
def dp(cluster, qwen3_embed_dir):
    yield from dp_server(qwen3_embed_dir, 2, "ray")


def test_every_route_matches_one_replica(single, dp):
    compare_routes(single, dp, EMBED_REQUESTS)
    assert dp.client.get("/health").json() == {"replicas": 2, "replicas_up": 2,
                                                "backend": "ray"}
    pids = {r.pid for r in dp.engine.replicas}
    assert len(pids) == 2  # two actor processes, each with its own engine


def test_killing_an_actor_under_load_loses_no_request(single, dp, qwen3_embed_dir):
    tok = mf.hf_tokenizer(qwen3_embed_dir)
    texts = [f"request {i}: " + mf.text_of_length(tok, 120, i) for i in range(32)]
    reference = [single.post("/v1/embeddings", {"input": t}).json()["data"][0]["embedding"]
                 for t in texts]
    responses = load_and_kill(dp, dp.engine, texts)
    assert [r.status_code for r in responses] == [200] * len(texts)
    for r, ref in zip(responses, reference):
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], ref, atol=2e-6)
    assert dp.engine.retried > 0
    assert wait_replicas_up(dp, 2)["replicas_up"] == 2
