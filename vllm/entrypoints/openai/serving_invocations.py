"""POST /invocations (SageMaker's route): the body's shape picks the route, among those the
served model supports, and the answer is exactly that route's."""
from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from vllm.entrypoints.openai.errors import bad_request
from vllm.entrypoints.openai.protocol import (ClassificationRequest, EmbeddingRequest,
                                              PoolingRequest, RerankRequest, ScoreRequest)
from vllm.entrypoints.openai.serving_engine import json_response
from vllm.entrypoints.openai.serving_pooling import ServingPooling
from vllm.entrypoints.openai.serving_score import ServingScores, without_absent_documents
from vllm.tasks import PoolingTask

_PAIR_KEYS = ("text_1", "queries", "data_1")
_SHAPES = ("`input` (embeddings, classification or pooling), `text_1`/`text_2` or "
           "`queries`/`documents` (score), or `query`/`documents` (rerank)")


def pick_route(body: dict, supported_tasks: tuple[str, ...]) -> str:
    """The route a body of this shape goes to on a model with these tasks."""
    if "query" in body:
        return "/rerank"
    if any(key in body for key in _PAIR_KEYS):
        return "/score"
    if "input" in body:
        for task, route in ((PoolingTask.EMBED, "/v1/embeddings"),
                            (PoolingTask.CLASSIFY, "/classify")):
            if task in supported_tasks:
                return route
        return "/pooling"
    raise bad_request(f"The body matches no route; send {_SHAPES}.")


def _parse(model: type[BaseModel], body: dict) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:  # reported exactly as the route itself reports it
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])}
                                      for e in exc.errors()]) from None


def make_router(pooling: ServingPooling, scores: ServingScores) -> APIRouter:
    router = APIRouter()
    ctx = pooling.ctx

    @router.post("/invocations")
    async def invocations(request: Request) -> Any:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            raise bad_request(f"Malformed JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise bad_request("The request body must be a JSON object.")
        route = pick_route(body, tuple(ctx.model_config.supported_tasks))
        ctx.task_for(route)  # 404 when the model cannot serve it
        if route == "/rerank":
            return JSONResponse(without_absent_documents(
                await scores.rerank(_parse(RerankRequest, body), request, route)))
        if route == "/score":
            return json_response(await scores.score(_parse(ScoreRequest, body), request, route))
        if route == "/v1/embeddings":
            return await pooling.embeddings(_parse(EmbeddingRequest, body), request)
        if route == "/classify":
            return await pooling.classify(_parse(ClassificationRequest, body), request)
        return await pooling.pooling(_parse(PoolingRequest, body), request)

    return router
