"""The pooling routes' direct path: a valid request skips FastAPI's router.

Each pooling route is registered twice by `post_route`: as a FastAPI route (OpenAPI
schema, and every request whose body does not validate, so error texts stay FastAPI's as
mapped by errors.py) and in `DirectRoutes`, which `RequestEdge` asks first once it holds the
body. A body that parses and validates goes straight to the handler: the same route guard,
the same pydantic model (`json.loads` then `model_validate`, as FastAPI validates a body),
the same handler and the same exception mapping, without FastAPI's per-request dependency
solving, its routing and its exception middleware. Those were about half of the event
loop's CPU per request (benchmarks/README.md, session 13), time during which, on 2 cores,
the engine's step waits or is preempted.
"""
from __future__ import annotations

import inspect
import json
from typing import Any, Awaitable, Callable

from fastapi import APIRouter, Request
from pydantic import BaseModel

from vllm.entrypoints.openai.errors import InternalErrorMiddleware, mapped_error_response

Handler = Callable[[Any, Request], Awaitable[Any]]


class DirectRoutes:
    """path -> (request model, handler) for the POST routes served directly, behind one
    route guard."""

    def __init__(self, guard: Callable[[str], Any]) -> None:
        """`guard(path)` raises the APIError (503/404) that answers before validation."""
        self._guard = guard
        self._routes: dict[str, tuple[type[BaseModel], Handler]] = {}

    def add(self, path: str, model: type[BaseModel], handler: Handler) -> None:
        self._routes[path] = (model, handler)

    async def dispatch(self, scope: dict, body: bytes, receive: Callable,
                       send: Callable) -> bool:
        """Answer the request and return True; False (nothing sent) when it is not a
        direct route's or its body does not validate: the app then answers it."""
        route = self._routes.get(scope["path"]) if scope.get("method") == "POST" and \
            not scope.get("root_path") else None
        if route is None:
            return False
        model, handler = route
        try:
            self._guard(scope["path"])
        except Exception:  # the app's route guard answers it, before validation, as always
            return False
        try:
            request = model.model_validate(json.loads(body))
        except Exception:
            return False

        async def answer(scope: dict, receive: Callable, send: Callable) -> None:
            try:
                response = await handler(request, Request(scope, receive))
            except Exception as exc:
                response = mapped_error_response(exc, scope["method"], scope["path"])
                if response is None:
                    raise
            await response(scope, receive, send)
        # What the app's handlers do not map is a 500 with an error id, as in the app.
        await InternalErrorMiddleware(answer)(scope, receive, send)
        return True


def post_route(router: APIRouter, direct: DirectRoutes, path: str,
               model: type[BaseModel], handler: Handler, dependencies: list[Any]) -> None:
    """Serve `handler(body: model, request) -> Response` on POST `path`, both as a FastAPI
    route (with `dependencies`) and directly."""
    async def endpoint(body: Any, request: Request) -> Any:
        return await handler(body, request)
    endpoint.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=model),
        inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                          annotation=Request)])
    endpoint.__name__ = "create" + path.replace("/", "_")
    router.add_api_route(path, endpoint, methods=["POST"], dependencies=dependencies,
                         name=endpoint.__name__)
    direct.add(path, model, handler)
