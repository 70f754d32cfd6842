"""GET /v1/models: the names this server answers to."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from vllm.entrypoints.openai.protocol import ModelCard, ModelList, ModelPermission
from vllm.entrypoints.openai.serving_engine import ServingContext, json_response, random_hex


def list_models(ctx: ServingContext) -> ModelList:
    config = ctx.model_config
    return ModelList(data=[
        ModelCard(id=name, root=str(config.model), max_model_len=config.max_model_len,
                  permission=[ModelPermission(id=f"modelperm-{random_hex()}")])
        for name in ctx.served_model_names])


def make_router(ctx: ServingContext) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def show_models() -> Any:
        return json_response(list_models(ctx))

    return router
