"""Several models behind one server: one app per model, a router in front.

Each model gets its own engine and its own FastAPI app, built exactly as a single-model
server is (its own pooling config, gate decision, KV cache, limits and metrics), so one
model behaves as if it were served alone. `ModelRouter` is the ASGI app in front:

- a POST goes to the app that serves the body's `model` (the first model when the body
  names none; a name no model has is upstream's 404 naming every served model);
- GET /v1/models lists every app's cards, in model order;
- GET /metrics merges the apps' series, each labelled with its model (`model_name`);
- GET /health is 200 only when every engine is healthy;
- everything else (GET /version, OPTIONS, ...) is answered by the first app.

With one model nothing of this runs: the server is that model's app, as before.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Optional

from vllm.entrypoints.openai.http_edge import (DEFAULT_BODY_READ_TIMEOUT_S,
                                               DEFAULT_MAX_REQUEST_BODY_BYTES, send_error)

Asgi = Callable[..., Any]


class ModelRouter:
    """The ASGI app in front of one app per model (see the module docstring)."""

    def __init__(self, apps: list[tuple[list[str], Asgi]],
                 max_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
                 body_timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S) -> None:
        self.apps = apps
        self.by_name = {name: app for names, app in apps for name in names}
        self.first = apps[0][1]
        self.max_bytes = max_body_bytes
        self.timeout_s = body_timeout_s
        self._merged = {"/v1/models": self._models, "/metrics": self._metrics,
                        "/health": self._health}

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            await self.first(scope, receive, send)
            return
        path = scope["path"].rstrip("/") or "/"
        if scope["method"] == "GET" and path in self._merged:
            await self._merged[path](scope, send)
        elif scope["method"] == "POST":
            await self._post(scope, receive, send)
        else:
            await self.first(scope, receive, send)

    # ----- POST: pick the app by the body's `model` -------------------------------------
    async def _post(self, scope: dict, receive: Callable, send: Callable) -> None:
        try:
            chunks = await asyncio.wait_for(_read(receive, self.max_bytes), self.timeout_s)
        except asyncio.TimeoutError:
            await send_error(send, 408, f"The request body did not arrive within "
                             f"{self.timeout_s:g} seconds.")
            return
        complete = bool(chunks) and chunks[-1] is None
        body = b"".join(c for c in chunks if c is not None)
        app: Optional[Asgi] = self.first  # too large, or not JSON: its edge answers
        name = _model_of(body) if complete else None
        if name:
            app = self._app_for(name)
        if app is None:
            await send_error(send, 404, f"The model `{name}` does not exist. This server "
                             f"serves: {', '.join(self.by_name)}.", param="model")
            return
        await app(scope, _replay([c for c in chunks if c is not None], complete, receive),
                  send)

    def _app_for(self, name: str) -> Optional[Asgi]:
        """The app serving `name`: a served name, else the app with a LoRA adapter of
        that name (adapters may be loaded at runtime, so each app's registry is asked)."""
        if name in self.by_name:
            return self.by_name[name]
        for _, app in self.apps:
            serving = getattr(getattr(app, "state", None), "serving", None)
            loras = getattr(serving, "loras", None)
            if loras is not None and loras.get(name) is not None:
                return app
        return None

    # ----- merged GETs -----------------------------------------------------------------
    async def _models(self, scope: dict, send: Callable) -> None:
        cards: list[Any] = []
        for _, app in self.apps:
            status, body = await _get(app, scope)
            if status != 200:
                await _send(send, status, body, b"application/json")
                return
            cards += json.loads(body)["data"]
        await _send(send, 200, json.dumps({"object": "list", "data": cards}).encode(),
                    b"application/json")

    async def _metrics(self, scope: dict, send: Callable) -> None:
        texts = []
        for names, app in self.apps:
            status, body = await _get(app, scope)
            texts.append((names[0], body.decode()))
        await _send(send, 200, merge_metrics(texts).encode(),
                    b"text/plain; version=0.0.4; charset=utf-8")

    async def _health(self, scope: dict, send: Callable) -> None:
        for _, app in self.apps:
            status, body = await _get(app, scope)
            if status != 200:
                await _send(send, status, body, b"application/json")
                return
        await _send(send, 200, b"", b"application/json")


def merge_metrics(texts: list[tuple[str, str]]) -> str:
    """One Prometheus exposition from several (model name, exposition): each family once,
    its samples from every model, and a `model_name` label on samples that lack one."""
    families: dict[str, list[str]] = {}
    for model, text in texts:
        family = None
        for line in text.splitlines():
            if line.startswith("# "):
                parts = line.split(" ", 3)
                family = parts[2] if len(parts) > 2 else family
                lines = families.setdefault(family, [])
                if line not in lines:
                    lines.append(line)
            elif line.strip():
                families.setdefault(family or "", []).append(_labelled(line, model))
    return "".join(line + "\n" for lines in families.values() for line in lines)


def _labelled(sample: str, model: str) -> str:
    if "model_name=" in sample.split(" ", 1)[0] or "model_name=" in sample.split("}", 1)[0]:
        return sample
    label = f'model_name="{model}"'
    if "{" in sample.split(" ", 1)[0]:
        return sample.replace("{", "{" + label + ",", 1)
    name, rest = sample.split(" ", 1)
    return f"{name}{{{label}}} {rest}"


def _model_of(body: bytes) -> Optional[str]:
    """The body's `model` as a string, or None (no JSON object, no model, or not a str)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    name = data.get("model") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


async def _read(receive: Callable, max_bytes: int) -> list[Optional[bytes]]:
    """The body's chunks, then None when it is complete; stops early past `max_bytes`."""
    chunks: list[Optional[bytes]] = []
    size = 0
    while size <= max_bytes:
        message = await receive()
        if message["type"] == "http.disconnect":
            return chunks
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            chunks.append(None)
            return chunks
    return chunks


def _replay(chunks: list[bytes], complete: bool, receive: Callable) -> Callable:
    """A `receive` that gives back the chunks read so far, then the client's own."""
    queue = list(chunks)

    async def replay() -> dict:
        if queue:
            chunk = queue.pop(0)
            return {"type": "http.request", "body": chunk,
                    "more_body": bool(queue) or not complete}
        return await receive()  # the rest of the body, or a disconnect
    return replay


async def _get(app: Asgi, scope: dict) -> tuple[int, bytes]:
    """Run a bodiless GET of `scope`'s path through `app`: (status, body)."""
    status, body = 500, []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))
    await app(dict(scope), receive, send)
    return status, b"".join(body)


async def _send(send: Callable, status: int, body: bytes, content_type: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Callable, send: Callable) -> None:
    """The apps need no start-up or shutdown hooks: acknowledge both."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
