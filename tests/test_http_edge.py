"""The HTTP edge at the connection level (raw sockets): a body over the size limit is a 413
at once, from its `Content-Length` or as soon as a chunked body crosses the limit, and the
connection then closes; an idle keep-alive connection stays open for `--timeout-keep-alive`
(flag, else VLLM_HTTP_TIMEOUT_KEEP_ALIVE), so a client idle for less is never cut off."""
from __future__ import annotations

import json
import socket
import time
import types

import pytest

from servers import Server

LIMIT = 32 * 1024 * 1024   # the default --max-request-body-bytes
KEEP_ALIVE_S = 3
HEAD = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
EMBED = json.dumps({"input": "hello"}).encode()


@pytest.fixture(scope="module")
def server(minilm_engine):
    """MiniLM with the default body limit, a 30 s body deadline (a 408 would show as a
    wait) and a 3 s keep-alive timeout."""
    server = Server(minilm_engine, served_model_name=["minilm"], body_read_timeout=30.0,
                    timeout_keep_alive=KEEP_ALIVE_S)
    yield server
    server.close()


def _connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _response(sock: socket.socket) -> tuple[bytes, dict, bytes]:
    """One response off `sock`: (status line, headers, body); the body by Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data[:200]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(b":", 1) for line in lines)}
    while len(body) < int(headers.get(b"content-length", b"0")):
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-response"
        body += chunk
    return status, headers, body


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `within` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    except socket.timeout:
        return False
    return True


def _assert_413(status: bytes, headers: dict, body: bytes) -> None:
    assert status.startswith(b"HTTP/1.1 413"), status
    assert headers[b"connection"] == b"close"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 413
    assert "--max-request-body-bytes" in error["message"]


@pytest.mark.parametrize("expect", [b"", b"Expect: 100-continue\r\n"])
def test_a_declared_body_over_the_limit_is_a_413_at_once(server, expect):
    """Only the headers arrive: the 413 comes from Content-Length (not the 408 after 30 s,
    and no `100 Continue` first), then the server closes the connection."""
    with _connect(server) as sock:
        start = time.monotonic()
        sock.sendall(HEAD + expect + b"Content-Length: 41943040\r\n\r\n")
        answer = _response(sock)
        assert time.monotonic() - start < 5
        _assert_413(*answer)
        assert _closed_by_server(sock, 5)
    assert server.post("/v1/embeddings", {"input": "canary"}).status_code == 200


def test_a_chunked_body_is_a_413_when_it_crosses_the_limit(server):
    """The client stops sending just past the limit, mid-body: the 413 is already out."""
    with _connect(server) as sock:
        sock.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        piece = 1024 * 1024
        chunk = b"%x\r\n" % piece + b"x" * piece + b"\r\n"
        for _ in range(LIMIT // piece + 1):
            sock.sendall(chunk)
        start = time.monotonic()
        answer = _response(sock)
        assert time.monotonic() - start < 5
        _assert_413(*answer)
        assert _closed_by_server(sock, 5)


def test_an_idle_keep_alive_connection_is_kept_for_the_timeout(server):
    """Idle 1.5 s (< 3 s) between requests: every request is answered on the same
    connection; idle past the timeout, the server closes it, at --timeout-keep-alive."""
    request = (HEAD + b"Content-Length: %d\r\n\r\n" % len(EMBED)) + EMBED
    with _connect(server) as sock:
        for i in range(4):
            if i:
                time.sleep(KEEP_ALIVE_S / 2)
            sock.sendall(request)
            status, headers, _ = _response(sock)
            assert status.startswith(b"HTTP/1.1 200") and b"connection" not in headers
        idle = time.monotonic()
        assert _closed_by_server(sock, KEEP_ALIVE_S + 5)
        assert KEEP_ALIVE_S - 0.5 < time.monotonic() - idle < KEEP_ALIVE_S + 1.5


def test_keep_alive_flag_and_variable_reach_uvicorn(monkeypatch):
    from vllm.entrypoints.cli.main import make_parser
    from vllm.entrypoints.openai.api_server import build_app, make_server

    def keep_alive(args) -> int:
        return make_server(build_app(None, args), args).config.timeout_keep_alive

    monkeypatch.delenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", raising=False)
    assert keep_alive(make_parser().parse_args(["serve", "m"])) == 5  # upstream's default
    assert keep_alive(types.SimpleNamespace()) == 5
    monkeypatch.setenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "75")
    assert keep_alive(make_parser().parse_args(["serve", "m"])) == 75
    assert keep_alive(types.SimpleNamespace()) == 75
    args = make_parser().parse_args(["serve", "m", "--timeout-keep-alive", "120"])
    assert keep_alive(args) == 120  # the flag wins over the variable
