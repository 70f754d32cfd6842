"""Shared by the data-parallel tests (mp and Ray): servers, body comparison, the route list."""
from __future__ import annotations

import asyncio
import base64
import threading
import time
from typing import Any

import httpx
import numpy as np

from test_server import Server
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.async_llm import AsyncLLM
from vllm.scaleout.dp_engine import DPAsyncLLM

NAME = "m"
QUERY = "What is the capital of France?"
DOCS = ["Paris is in France.", "Bananas are yellow", "x"]
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog", "a"]
VOLATILE = ("id", "created")


def dp_server(model: str, size: int, backend: str, **kwargs: Any):
    """Fixture body: `size` replicas behind one server (size 0: a plain AsyncLLM)."""
    args = EngineArgs.from_kwargs(model, **kwargs)
    engine = AsyncLLM.from_engine_args(args) if size == 0 else \
        DPAsyncLLM.start(args, size, backend)
    server = Server(engine, served_model_name=NAME)
    yield server
    server.close()
    engine.shutdown()


def same_body(a: Any, b: Any, path: str = "") -> None:
    """Equal JSON bodies: floats within float32 rounding, ids and timestamps ignored."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, a, b)
        for k in a:
            if k not in VOLATILE:
                same_body(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (path, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            same_body(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        np.testing.assert_allclose(a, b, atol=2e-6, err_msg=path)
    else:
        assert a == b, (path, a, b)


EMBED_REQUESTS = [
    ("/v1/embeddings", {"model": NAME, "input": TEXTS}),
    ("/v1/embeddings", {"input": TEXTS[1], "encoding_format": "base64"}),
    ("/v1/embeddings", {"input": [[1, 2, 3, 4, 5], [7, 8]]}),
    ("/v1/embeddings", {"input": "long " * 40, "truncate_prompt_tokens": 5}),
    ("/pooling", {"input": TEXTS[:2]}),
    ("/score", {"text_1": QUERY, "text_2": DOCS}),
    ("/v1/score", {"text_1": [QUERY, QUERY], "text_2": DOCS[:2]}),
    ("/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2}),
    ("/v1/rerank", {"query": QUERY, "documents": DOCS}),
    ("/v2/rerank", {"query": QUERY, "documents": DOCS, "return_documents": False}),
    ("/tokenize", {"prompt": QUERY}),
    ("/detokenize", {"tokens": [5, 6, 7]}),
    # errors: the same status and body
    ("/v1/embeddings", {"model": "nope", "input": "a"}),
    ("/v1/embeddings", {"input": []}),
    ("/v1/embeddings", {"input": "word " * 5000}),
    ("/v1/embeddings", {"input": [[10 ** 9]]}),
    ("/classify", {"input": "a"}),
    ("/v1/embeddings", {"input": "a", "dimensions": 3}),
]
CLASSIFY_REQUESTS = [
    ("/classify", {"input": TEXTS}),
    ("/score", {"text_1": QUERY, "text_2": DOCS}),
    ("/rerank", {"query": QUERY, "documents": DOCS}),
    ("/v1/embeddings", {"input": "a"}),
]


def _decoded(body: dict, request: dict) -> dict:
    """A base64 float32 embeddings body with its vectors decoded: replicas agree to float32
    rounding, not bit for bit (a row's projection may run on the few-row kernel in one
    replica's step and on oneDNN in another's, whose sums round differently)."""
    if request.get("encoding_format") != "base64" or "data" not in body:
        return body
    data = [{**item, "embedding": np.frombuffer(base64.b64decode(item["embedding"]),
                                                dtype=np.float32).tolist()}
            for item in body["data"]]
    return {**body, "data": data}


def compare_routes(single: Server, dp: Server, requests: list) -> None:
    for path, body in requests:
        a, b = single.post(path, body), dp.post(path, body)
        assert a.status_code == b.status_code, (path, body, a.text, b.text)
        same_body(_decoded(a.json(), body), _decoded(b.json(), body), path)
    for path in ("/v1/models",):
        same_body(single.client.get(path).json(), dp.client.get(path).json(), path)


def metric(text: str, name: str) -> dict[str, float]:
    """{replica label: value} of an engine metric."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            replica = labels.split('replica="', 1)[1].split('"', 1)[0]
            out[replica] = float(value)
    return out


def load_and_kill(server: Server, engine: DPAsyncLLM, texts: list[str],
                  clients: int = 6) -> list[httpx.Response]:
    """Send `texts` from `clients` concurrent clients; kill replica 0 once it is computing
    some of them. Returns every response, in text order."""
    killed = threading.Event()

    def killer() -> None:
        deadline = time.monotonic() + 60
        while engine._loads[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        engine.replicas[0].kill()
        killed.set()

    async def client(http: httpx.AsyncClient, mine: list[tuple[int, str]]) -> list:
        return [(i, await http.post("/v1/embeddings", json={"input": t})) for i, t in mine]

    async def main() -> list:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
            return await asyncio.gather(*(client(http, list(enumerate(texts))[c::clients])
                                          for c in range(clients)))

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    results = dict(pair for row in asyncio.run(main()) for pair in row)
    thread.join(5)
    assert killed.is_set()
    return [results[i] for i in range(len(texts))]


def wait_replicas_up(server: Server, n: int, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = server.client.get("/health")
        if r.status_code == 200 and r.json()["replicas_up"] == n:
            return r.json()
        time.sleep(0.5)
    raise AssertionError(f"replicas did not come back: {server.client.get('/health').text}")
