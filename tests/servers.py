"""Servers for the HTTP tests: `Server` (uvicorn on a free loopback port, in-process) and
session fixtures shared by every test module (imported into conftest.py): the real MiniLM
behind two front ends, and one server each for tiny seeded models."""
from __future__ import annotations

import threading
import time
import types

import httpx
import pytest

from vllm.engine.arg_utils import EngineArgs
from vllm.engine.async_llm import AsyncLLM
from vllm.entrypoints.openai.api_server import bind_socket, build_app, make_server

MINILM = "minilm"
API_KEY = "sekret-key"


class Server:
    """A uvicorn server for `build_app(async_llm, args)` on a free loopback port."""

    def __init__(self, async_llm, **args) -> None:
        ns = types.SimpleNamespace(uvicorn_log_level="warning", disable_uvicorn_access_log=True,
                                   **args)
        self.engine = async_llm
        self.app = build_app(async_llm, ns)
        sock = bind_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = make_server(self.app, ns)
        if getattr(ns, "grpc_port", None) is not None:  # TEI's gRPC service beside it
            from vllm.entrypoints.grpc.server import grpc_companion
            self.server.companions = [grpc_companion(ns)(self.app)]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        self.client = httpx.Client(base_url=self.url, timeout=60)
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)

    @property
    def grpc_target(self) -> str:
        """host:port of the gRPC service (a server built with grpc_port=0)."""
        return f"127.0.0.1:{self.app.state.grpc_port}"

    def post(self, path: str, body=None, **kw) -> httpx.Response:
        return self.client.post(path, json=body, **kw)

    def close(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(15)


def _engine(model: str, **kwargs) -> AsyncLLM:
    return AsyncLLM.from_engine_args(EngineArgs.from_kwargs(model, **kwargs))


@pytest.fixture(scope="session")
def minilm_engine(minilm_dir):
    engine = _engine(minilm_dir)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def minilm(minilm_engine):
    server = Server(minilm_engine, served_model_name=[MINILM, "alias"])
    yield server
    server.close()


@pytest.fixture(scope="session")
def secured(minilm_engine):
    """The same engine behind an API key and a 4 KiB body limit."""
    server = Server(minilm_engine, served_model_name=[MINILM], api_key=API_KEY,
                    max_request_body_bytes=4096)
    yield server
    server.close()


@pytest.fixture(scope="session")
def minilm_llm(shared_llm, minilm_dir):
    return shared_llm(minilm_dir)


def _model_server(path: str, **engine_kwargs):
    """Fixture body: an engine for `path` behind its own server, both stopped afterwards."""
    engine = _engine(path, **engine_kwargs)
    server = Server(engine)
    yield server
    server.close()
    engine.shutdown()


@pytest.fixture(scope="session")
def cross_encoder(bert_cls_dir):
    yield from _model_server(bert_cls_dir)


@pytest.fixture(scope="session")
def classifier3(bert_cls3_dir):
    yield from _model_server(bert_cls3_dir)


@pytest.fixture(scope="session")
def qwen3(qwen3_embed_dir):
    yield from _model_server(qwen3_embed_dir)
