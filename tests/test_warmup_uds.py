"""Start-up warm-up (`--no-warmup` skips it) and serving on a Unix socket (`--uds`)."""
from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

from test_server import _start_cli, stop_cli
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.async_llm import AsyncLLM
from vllm.engine.warmup import warm_up, warmup_tasks
from vllm.entrypoints.openai.api_server import bind_unix_socket, close_listener


def _env() -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def _steps(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    return float(re.search(r"^vllm:engine_steps_total\{[^}]*\} (\S+)", text, re.M).group(1))


def test_serve_warms_up_before_listening(minilm_dir):
    """The default `vllm serve`: the warm-up ran (its log line, before "Listening on"), and
    its requests are not in /metrics: the counters start at zero for users."""
    proc, url, log = _start_cli(["vllm.entrypoints.cli.main", "serve", minilm_dir,
                                 "--port", "0", "--disable-uvicorn-access-log"], _env())
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            assert _steps(http) == 0  # the warm-up's steps were not kept in the counters
            assert http.post("/v1/embeddings", json={"input": "warm up"}).status_code == 200
            assert _steps(http) == 1
        stop_cli(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(log)
    warm = re.search(r"Warm-up: 2 batch\(es\) of 2 prompts \(encode, embed\) in [\d.]+ s\.",
                     text)
    assert warm and warm.start() < text.index("Listening on"), text


def _start_uds(argv: list[str], path: str) -> tuple[subprocess.Popen, list[str]]:
    """Start a server on a Unix socket; return it once /health answers 200."""
    proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_env())
    log: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        log.append(line)
        if f"Listening on unix:{path}" in line:
            break
    if f"Listening on unix:{path}" not in "".join(log):
        proc.kill()
        proc.wait()
        raise AssertionError("".join(log))
    return proc, log


def test_uds_serves_and_no_warmup_skips(minilm_dir):
    """`--uds PATH --no-warmup`: HTTP over the Unix socket (httpx's uds transport), --port
    ignored; no warm-up step ran before the first request; the socket file goes on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "vllm.sock")
        proc, log = _start_uds(["vllm.entrypoints.cli.main", "serve", minilm_dir, "--uds",
                                path, "--port", "1", "--no-warmup",
                                "--disable-uvicorn-access-log"], path)
        try:
            transport = httpx.HTTPTransport(uds=path)
            with httpx.Client(transport=transport, base_url="http://localhost",
                              timeout=30) as http:
                deadline = time.monotonic() + 30
                while http.get("/health").status_code != 200:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
                assert _steps(http) == 0
                r = http.post("/v1/embeddings", json={"input": "over a unix socket"})
                assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384
                assert _steps(http) == 1
            stop_cli(proc, log)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert not os.path.exists(path)
    text = "".join(log)
    assert "Warm-up skipped (--no-warmup)" in text and "Warm-up:" not in text


def test_uds_refuses_live_socket_and_other_files():
    """A live server's socket and a plain file are refused with a clear error; a stale
    socket file is replaced."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s.sock")
        live = bind_unix_socket(path)
        with pytest.raises(ValueError, match="another server is listening"):
            bind_unix_socket(path)
        live.close()  # the file stays: a stale socket
        assert os.path.exists(path)
        again = bind_unix_socket(path)
        assert again.family == socket.AF_UNIX
        close_listener(again, path)
        assert not os.path.exists(path)
        plain = os.path.join(tmp, "file")
        open(plain, "w").close()
        with pytest.raises(ValueError, match="exists and is not a socket"):
            bind_unix_socket(plain)


def test_warm_up_cross_encoder_runs_each_task(bert_cls_dir):
    """A cross-encoder warms encode, classify and score (pairs); warm-up blocks carry
    their own cache salt, so nothing a user sends hits them."""
    engine = AsyncLLM.from_engine_args(EngineArgs.from_kwargs(bert_cls_dir))
    try:
        tasks = warmup_tasks(engine.model_config)
        assert tasks == ["encode", "classify", "score"]
        report = asyncio.run(warm_up(engine))
        assert report.failed == {} and report.tasks == tasks
        assert engine.stats.num_requests_finished == 2 * len(tasks)
        assert "3 batch(es)" in report.describe()
    finally:
        engine.shutdown()


def test_warm_up_leaves_no_cache_hits(qwen3_embed_dir):
    """On a causal model with prefix caching (the gate's default), a user's request with
    the warm-up's text reports no cached tokens after the warm-up (block size 1: every
    token of the warm-up prompts sits in a full, hashed block)."""
    engine = AsyncLLM.from_engine_args(EngineArgs.from_kwargs(qwen3_embed_dir, block_size=1))
    try:
        assert engine.vllm_config.cache_config.enable_prefix_caching
        assert asyncio.run(warm_up(engine)).failed == {}

        async def user(rid: str) -> int:
            prompt = (await engine.tokenize_prompts(["warm up"]))[0]
            from vllm.pooling_params import PoolingParams
            params = PoolingParams()
            params.verify("embed", engine.model_config)
            return (await engine.submit(prompt, params, rid)).num_cached_tokens
        assert asyncio.run(user("user-1")) == 0
        assert asyncio.run(user("user-2")) > 0  # the cache works: the user's own blocks hit
    finally:
        engine.shutdown()
