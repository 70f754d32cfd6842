"""GET /v1/models: the names this server answers to."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from vllm.entrypoints.openai.responses import ModelCard, ModelList, ModelPermission
from vllm.entrypoints.openai.serving_engine import ServingContext, json_response, random_hex


def list_models(ctx: ServingContext) -> ModelList:
    """The served names first, then one card per LoRA adapter (root: its directory,
    parent: its base model), as upstream lists them."""
    config = ctx.model_config
    cards = [ModelCard(id=name, root=str(config.model), max_model_len=config.max_model_len,
                       permission=[_permission()])
             for name in ctx.served_model_names]
    if ctx.loras is not None:
        cards += [ModelCard(id=name, root=root, parent=parent, permission=[_permission()])
                  for name, root, parent in ctx.loras.cards()]
    return ModelList(data=cards)


def _permission() -> ModelPermission:
    return ModelPermission(id=f"modelperm-{random_hex()}")


def make_router(ctx: ServingContext) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def show_models() -> Any:
        return json_response(list_models(ctx))

    return router
