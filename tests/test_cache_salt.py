"""Upstream's `cache_salt` request field: prompts with different salts never share cached
prefix blocks, the same salt does; a bad salt is a 400 with upstream's wording."""
from __future__ import annotations

import pytest

TEXT = " ".join(f"w{i % 7}" for i in range(60))


def _hits(server) -> int:
    return server.engine.stats.prefix_cache_hits


def _embed(server, **extra):
    r = server.post("/v1/embeddings", {"input": TEXT, **extra})
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["embedding"]


def test_salts_keep_cached_prefixes_apart(qwen3):
    assert qwen3.engine.vllm_config.cache_config.enable_prefix_caching
    first = _embed(qwen3, cache_salt="tenant-a")
    hits = _hits(qwen3)
    other = _embed(qwen3, cache_salt="tenant-b")  # same text, another salt: no hit
    assert _hits(qwen3) == hits
    assert max(abs(a - b) for a, b in zip(first, other)) < 1e-5
    _embed(qwen3, cache_salt="tenant-a")  # the same salt again: its blocks are found
    assert _hits(qwen3) > hits
    hits = _hits(qwen3)
    r = qwen3.post("/pooling", {"input": TEXT, "cache_salt": "tenant-c"})
    assert r.status_code == 200 and _hits(qwen3) == hits
    r = qwen3.post("/score", {"text_1": TEXT, "text_2": "x", "cache_salt": "tenant-d"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("salt,message", [
    ("", "Parameter 'cache_salt' must be a non-empty string if provided."),
    (5, "Parameter 'cache_salt' must be a non-empty string if provided."),
    ("a/b", "must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL."),
    ("x" * 129, "must be at most 128 characters"),
])
def test_bad_salt_is_a_400(qwen3, salt, message):
    r = qwen3.post("/v1/embeddings", {"input": "hi", "cache_salt": salt})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["param"] == "cache_salt"
