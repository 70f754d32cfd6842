"""The HTTP edge: what happens to a request before any route sees it.

Outermost first: CORS (a browser's preflight is answered before the API key is asked
for), the API key, metrics, then `RequestEdge`: one trailing slash dropped (never a
redirect to a client-chosen Host), a route the model cannot serve answered 404 before its
body is read, a POST body that is not JSON refused, and the body read under a size limit
(413) and a deadline (408), then replayed to the app.

A body over the limit is answered 413 the moment that shows: from `Content-Length`, before
any of the body is read, or when a chunked body crosses the limit; the connection then
closes (a 413 or a 408 leaves the request's remaining bytes unread, so the connection cannot
serve another request).
"""
from __future__ import annotations

import asyncio
import hmac
import time
from typing import Any, Callable, Optional

from vllm.entrypoints.openai.errors import error_bytes

# Reachable without an API key, so probes and scrapers need no secret.
UNAUTHENTICATED_PATHS = frozenset({"/health", "/metrics"})
DEFAULT_MAX_REQUEST_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_BODY_READ_TIMEOUT_S = 30.0
# After the 413 is sent, what the client is still sending is read and dropped (a lingering
# close, so that a client that writes its whole body before reading the answer reads the
# 413 rather than a connection reset) while it keeps arriving: up to DRAIN_FACTOR times the
# limit in all, with no gap longer than LINGER_S, within the body-read deadline. Then the
# connection is closed.
DRAIN_FACTOR = 4
LINGER_S = 2.0


async def send_error(send: Callable, status: int, message: str,
                     headers: Optional[list[tuple[bytes, bytes]]] = None,
                     param: Optional[str] = None, more_body: bool = False,
                     **extra: Any) -> None:
    """The error JSON envelope as the whole response; with `more_body` the response is
    left open (all its bytes sent) until an empty `http.response.body` ends it."""
    body = error_bytes(status, message, param, **extra)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body, "more_body": more_body})


def _header(scope: dict, name: bytes) -> Optional[bytes]:
    return next((v for k, v in scope.get("headers", ()) if k == name), None)


class AuthMiddleware:
    """`Authorization: Bearer <key>` on every route but /health and /metrics."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope.get("path") not in UNAUTHENTICATED_PATHS:
            given = _header(scope, b"authorization") or b""
            if not hmac.compare_digest(given, self.expected):
                what = "is missing" if not given else "is invalid"
                await send_error(send, 401, f"The API key {what}: send the header "
                                 "`Authorization: Bearer <key>`.",
                                 [(b"www-authenticate", b"Bearer")])
                return
        await self.app(scope, receive, send)


class _BodyTimeout(Exception):
    pass


class RequestEdge:
    """Path, route and body checks before the app (see the module docstring).

    `route_error(path)` returns a message when the served model cannot serve `path` (a
    404 for any method, before the body is read), else None. `direct`: the routes served
    without FastAPI's router once the body is read (direct_routes.DirectRoutes)."""

    def __init__(self, app: Any, max_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
                 timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S,
                 route_error: Callable[[str], Optional[str]] = lambda path: None,
                 direct: Any = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.route_error = route_error
        self.direct = direct

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope = _without_trailing_slash(scope)
        missing = self.route_error(scope["path"])
        if missing is not None:  # upstream registers no such route: FastAPI's "detail" too
            await send_error(send, 404, missing, detail="Not Found")
            return
        if scope.get("method") == "POST" and not _is_json(scope):
            await send_error(send, 400, "Unsupported Media Type: Only 'application/json' is "
                             "allowed (send the header `Content-Type: application/json`).")
            return
        declared = _header(scope, b"content-length")
        if declared is not None and not declared.strip().isdigit():
            await send_error(send, 400, "The Content-Length header is not a number.")
            return
        deadline = time.monotonic() + self.timeout_s
        if declared is not None and int(declared) > self.max_bytes:
            await self._refuse_too_large(receive, send, deadline, 0)
            return
        try:
            read = await self._read(receive, deadline)
        except _BodyTimeout:
            await send_error(send, 408, f"The request body did not arrive within "
                             f"{self.timeout_s:g} s (--body-read-timeout).",
                             [(b"connection", b"close")])
            return
        if read is None:  # the client disconnected while sending
            return
        body, received = read
        if received > self.max_bytes:
            await self._refuse_too_large(receive, send, deadline, received)
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # afterwards: wait for the disconnect, as ASGI does
        if self.direct is not None and await self.direct.dispatch(scope, body, replay, send):
            return
        await self.app(scope, replay, send)

    async def _read(self, receive: Callable,
                    deadline: float) -> Optional[tuple[bytes, int]]:
        """(the body, the bytes received); None when the client went away. Reading stops
        as soon as the body crosses the limit (the bytes received are then over it)."""
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await _receive_within(receive, deadline - time.monotonic())
            if message is None:
                raise _BodyTimeout()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_bytes:
                return b"", received
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), received

    async def _refuse_too_large(self, receive: Callable, send: Callable, deadline: float,
                                received: int) -> None:
        """The 413 at once, then a lingering close (see LINGER_S): its bytes are all sent
        before the rest of the body is drained; ending the response closes the
        connection."""
        await send_error(send, 413, f"The request body is larger than the server's limit of "
                         f"{self.max_bytes} bytes (--max-request-body-bytes).",
                         [(b"connection", b"close")], more_body=True)
        while received <= DRAIN_FACTOR * self.max_bytes:
            left = min(LINGER_S, deadline - time.monotonic())
            message = await _receive_within(receive, left)
            if message is None or message["type"] != "http.request":
                break
            received += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _receive_within(receive: Callable, seconds: float) -> Optional[dict]:
    """The next ASGI message, or None when none arrived within `seconds`."""
    if seconds <= 0:
        return None
    try:
        if _TIMEOUT is None:
            return await asyncio.wait_for(receive(), seconds)
        async with _TIMEOUT(seconds):  # no task per read, as wait_for makes
            return await receive()
    except asyncio.TimeoutError:
        return None


_TIMEOUT = getattr(asyncio, "timeout", None)  # Python 3.11+


def _without_trailing_slash(scope: dict) -> dict:
    path = scope.get("path", "")
    if len(path) > 1 and path.endswith("/"):
        raw = scope.get("raw_path")
        return {**scope, "path": path.rstrip("/") or "/",
                "raw_path": raw.rstrip(b"/") if isinstance(raw, bytes) else raw}
    return scope


def _is_json(scope: dict) -> bool:
    ctype = (_header(scope, b"content-type") or b"").split(b";")[0].strip().lower()
    return ctype == b"application/json" or (ctype.startswith(b"application/")
                                            and ctype.endswith(b"+json"))
