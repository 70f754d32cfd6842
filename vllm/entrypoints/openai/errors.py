"""The one error mapping of the server: every failure becomes
`{"error": {"message", "type", "param", "code"}}` with `code` = the HTTP status."""
from __future__ import annotations

import json
import random
from http import HTTPStatus
from typing import Any, Optional

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from vllm.engine.async_llm import EngineDeadError
from vllm.logger import init_logger

logger = init_logger(__name__)

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "PayloadTooLargeError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """An error with its HTTP status; raised anywhere in a handler."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.param = param
        self.headers = headers


class ClientDisconnected(APIError):
    """The HTTP client went away before the answer was ready; its requests were aborted."""

    def __init__(self) -> None:
        super().__init__(499, "The client disconnected; the request was aborted.")


def bad_request(message: str, param: Optional[str] = None) -> APIError:
    return APIError(400, message, param)


# Upstream 0.33's answer to every request on a dead engine; the cause stays in the log.
ENGINE_DEAD_MESSAGE = "The server had an error while processing your request."


def engine_dead(cause: BaseException) -> APIError:
    """The 500 a request gets when the engine has stopped (upstream's status and message)."""
    logger.error("Request refused: the engine is dead (%s).", cause)
    return APIError(500, ENGINE_DEAD_MESSAGE)


def internal_error(what: str) -> APIError:
    """A 500 whose message carries an error id and no internals: the exception being
    handled (type, message, traceback) goes to the log under the same id."""
    error_id = f"err-{random.getrandbits(64):016x}"
    logger.error("%s [error id %s]", what, error_id, exc_info=True)
    return APIError(500, f"{what} The error id is {error_id}; the server log has the "
                    "details.")


def error_body(status: int, message: str, param: Optional[str] = None) -> dict[str, Any]:
    etype = ERROR_TYPES.get(status)
    if etype is None:
        etype = HTTPStatus(status).phrase.replace(" ", "") + "Error" if status in \
            HTTPStatus._value2member_map_ else "Error"
    return {"error": {"message": message, "type": etype, "param": param, "code": status}}


_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def json_bytes(content: Any) -> bytes:
    """`content` (plain data or a pydantic model) as compact UTF-8 JSON, with orjson as
    upstream serves its responses; NaN and infinities become null, as pydantic writes
    them. What orjson refuses (a lone surrogate in a string, an integer beyond 64 bits)
    is written by the standard library, with non-ASCII characters escaped."""
    model = content if isinstance(content, BaseModel) else None
    try:
        return orjson.dumps(content if model is None else model.model_dump(),
                            option=_ORJSON_OPTIONS)
    except TypeError:
        data = content if model is None else model.model_dump(mode="json")
        return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


class OrjsonResponse(Response):
    """A JSON response serialized by `json_bytes` (the app's default response class)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json_bytes(content)


def error_response(status: int, message: str, param: Optional[str] = None,
                   headers: Optional[dict[str, str]] = None) -> Response:
    return OrjsonResponse(error_body(status, message, param), status_code=status,
                          headers=headers)


def error_bytes(status: int, message: str, param: Optional[str] = None,
                **extra: Any) -> bytes:
    """The error body serialized, for ASGI middleware that answers on its own; `extra`
    adds top-level fields beside `error`."""
    return json_bytes({**error_body(status, message, param), **extra})


# Fields that accept several shapes: one plain sentence instead of an error per shape.
_UNION_FIELDS = {
    "input": "a string, a list of strings, a list of token ids or a list of token-id lists",
    "text_1": "a string or a list of strings",
    "text_2": "a string or a list of strings",
}


def _validation_message(exc: RequestValidationError) -> tuple[str, Optional[str]]:
    """A short, readable message (and the offending top-level field) from pydantic errors."""
    errors = list(exc.errors())
    for err in errors:
        named = (err.get("ctx") or {}).get("error")
        if isinstance(named, ValueError) and getattr(named, "field", None):
            return str(named), named.field  # our own errors name their field
        if err.get("type") == "json_invalid":
            detail = (err.get("ctx") or {}).get("error", "")
            return f"Malformed JSON body: {detail}".rstrip(": "), None
    fields = [str(err["loc"][1]) for err in errors
              if len(err.get("loc", ())) > 1 and err["loc"][0] == "body"]
    if fields and fields[0] in _UNION_FIELDS and fields.count(fields[0]) > 1:
        field = fields[0]
        return f"Invalid request: `{field}` must be {_UNION_FIELDS[field]}.", field
    parts: list[str] = []
    param: Optional[str] = None
    seen: set[str] = set()
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        # Union members add their type name to the location; keep the user's field path.
        path = ".".join(p for p in loc if not _is_type_tag(p)) or "body"
        if param is None and loc:
            param = loc[0]
        if err.get("type") == "missing" and path == "body":
            text = "The request body must be a JSON object."
        elif err.get("type") == "model_attributes_type" and path == "body":
            text = "The request body must be a JSON object."
        else:
            text = f"{path}: {err.get('msg', 'invalid value')}{_given(err)}"
        if text not in seen:
            seen.add(text)
            parts.append(text)
    if len(parts) > 4:
        parts = parts[:4] + [f"... ({len(parts) - 4} more)"]
    return "Invalid request: " + "; ".join(parts), param


def _given(err: dict) -> str:
    """' [literal_error; got 'foo']': pydantic's error type and the offending value (as
    upstream's message carries them), a scalar only and at most 100 characters."""
    kind, value = err.get("type"), err.get("input")
    if not kind or kind == "missing":
        return ""
    if not isinstance(value, (str, int, float, bool)):
        return f" [{kind}]"
    shown = repr(value)
    return f" [{kind}; got {shown[:100]}{'...' if len(shown) > 100 else ''}]"


def _is_type_tag(part: str) -> bool:
    return part.startswith(("list[", "str", "int", "float", "bool", "literal[", "function-")) \
        or part in ("constrained-int",)


# The exception types a handler may raise that have an answer of their own, most specific
# first (Starlette picks a handler by the exception's MRO; none of these derives from another).
MAPPED_ERRORS = (APIError, RequestValidationError, StarletteHTTPException, EngineDeadError,
                 ValueError)


def mapped_error_response(exc: Exception, method: str = "",
                          path: str = "") -> Optional[Response]:
    """The answer to an exception a handler raised, or None when it has no mapping (a 500,
    see InternalErrorMiddleware). Shared by the app's exception handlers and the direct
    routes (direct_routes.py), so both answer alike."""
    if isinstance(exc, APIError):
        return error_response(exc.status, exc.message, exc.param, exc.headers)
    if isinstance(exc, RequestValidationError):
        message, param = _validation_message(exc)
        return error_response(400, message, param)
    if isinstance(exc, StarletteHTTPException):
        if exc.status_code == 404:
            message = f"Route {method} {path} does not exist."
        elif exc.status_code == 405:
            message = f"Method {method} is not allowed on {path}."
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))
    if isinstance(exc, EngineDeadError):
        return mapped_error_response(engine_dead(exc))
    if isinstance(exc, ValueError):
        return error_response(400, str(exc))
    return None


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception type to the shared error body."""

    async def _mapped(request: Request, exc: Exception) -> Response:
        response = mapped_error_response(exc, request.method, request.url.path)
        assert response is not None
        return response

    for kind in MAPPED_ERRORS:
        app.add_exception_handler(kind, _mapped)

    app.add_middleware(InternalErrorMiddleware)


class InternalErrorMiddleware:
    """Any exception a handler did not map is a 500 with an error id (see `internal_error`),
    answered here and not re-raised: Starlette's own last-resort handler re-raises after
    answering, and uvicorn then reset the connection before the client read the 500."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, receive, send_tracked)
        except Exception:
            err = internal_error("Internal server error.")
            if started:  # too late for a status: the connection just closes
                return
            body = error_bytes(err.status, err.message)
            await send({"type": "http.response.start", "status": err.status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
