"""POST /v1/embeddings, /pooling and /classify: one engine request per input."""
from __future__ import annotations

import base64
from typing import Any

import torch
from fastapi import APIRouter, Request

from vllm.entrypoints.openai.protocol import (ClassificationData, ClassificationRequest,
                                              ClassificationResponse, EmbeddingRequest,
                                              EmbeddingResponse, EmbeddingResponseData,
                                              PoolingRequest, PoolingResponse,
                                              PoolingResponseData, UsageInfo)
from vllm.entrypoints.openai.errors import bad_request
from vllm.entrypoints.openai.serving_engine import ServingContext, json_response
from vllm.entrypoints.sparse import check_sparse
from vllm.outputs import sparse_weights


def encode_base64(data: torch.Tensor) -> str:
    """Little-endian float32 bytes of the (flattened) tensor, base64-encoded."""
    array = data.detach().to(torch.float32).contiguous().reshape(-1).numpy()
    return base64.b64encode(array.astype("<f4", copy=False).tobytes()).decode("ascii")


def as_list(data: torch.Tensor) -> list[float]:
    """The output's values as a flat list; a 1-D output (the usual case) skips `reshape`,
    a torch op that hands the GIL to the engine thread mid-request."""
    return data.tolist() if data.dim() == 1 else data.reshape(-1).tolist()


def prompt_tokens(outputs: list[Any]) -> int:
    return sum(len(o.prompt_token_ids) for o in outputs)


class ServingPooling:
    """Embeddings, raw pooling and classification over the shared serving context."""

    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def _encode(self, http: Request, route: str, body: Any, prefix: str,
                      **param_fields: Any) -> tuple[str, str, list[Any]]:
        ctx = self.ctx
        model = ctx.check_model(body.model)
        task = ctx.task_for(route)
        if getattr(body, "task", None) is not None:  # /pooling may name the task
            task = ctx.check_task(body.task)
        params = ctx.make_params(task, **param_fields)
        prompts = await ctx.tokenize(ctx.input_prompts(body.input), body.truncate_prompt_tokens,
                                     body.add_special_tokens)
        response_id = ctx.response_id(http, prefix, body)
        outputs = await ctx.run(http, prompts, params, response_id)
        return model, response_id, outputs

    async def embeddings(self, body: EmbeddingRequest, http: Request) -> EmbeddingResponse:
        if body.sparse:
            try:
                check_sparse(self.ctx.model_config)
            except ValueError as exc:
                raise bad_request(str(exc), "sparse") from exc
            if body.encoding_format == "base64":
                raise bad_request("sparse embeddings are JSON objects; use "
                                  "encoding_format 'float' with sparse.", "encoding_format")
        model, rid, outputs = await self._encode(
            http, "/v1/embeddings", body, "embd", dimensions=body.dimensions,
            normalize=body.normalize, use_activation=body.use_activation)
        b64 = body.encoding_format == "base64"
        data = [EmbeddingResponseData(
            index=i, embedding=sparse_weights(o.outputs.data) if body.sparse else
            encode_base64(o.outputs.data) if b64 else as_list(o.outputs.data))
            for i, o in enumerate(outputs)]
        return EmbeddingResponse(id=rid, model=model, data=data,
                                 usage=UsageInfo.of(prompt_tokens(outputs)))

    async def pooling(self, body: PoolingRequest, http: Request) -> PoolingResponse:
        # Parameters that belong to another task (e.g. dimensions) are refused by name.
        if body.sparse:
            raise bad_request("sparse is an option of /v1/embeddings, not /pooling.", "sparse")
        model, rid, outputs = await self._encode(
            http, "/pooling", body, "pool", softmax=body.softmax,
            use_activation=body.use_activation, dimensions=body.dimensions,
            normalize=body.normalize)
        b64 = body.encoding_format == "base64"
        data = [PoolingResponseData(
            index=i, data=encode_base64(o.outputs.data) if b64 else o.outputs.data.tolist())
            for i, o in enumerate(outputs)]
        return PoolingResponse(id=rid, model=model, data=data,
                               usage=UsageInfo.of(prompt_tokens(outputs)))

    async def classify(self, body: ClassificationRequest,
                       http: Request) -> ClassificationResponse:
        model, rid, outputs = await self._encode(
            http, "/classify", body, "classify", activation=body.activation,
            use_activation=body.use_activation)
        id2label = self.ctx.model_config.id2label
        data = []
        for i, o in enumerate(outputs):
            probs = as_list(o.outputs.data)
            best = max(range(len(probs)), key=probs.__getitem__)
            data.append(ClassificationData(index=i, label=id2label.get(best, f"LABEL_{best}"),
                                           probs=probs, num_classes=len(probs)))
        return ClassificationResponse(id=rid, model=model, data=data,
                                      usage=UsageInfo.of(prompt_tokens(outputs)))


def make_router(serving: ServingPooling) -> APIRouter:
    router = APIRouter()
    guard = serving.ctx.route_guard

    @router.post("/v1/embeddings", dependencies=[guard("/v1/embeddings")])
    async def create_embeddings(body: EmbeddingRequest, request: Request) -> Any:
        return json_response(await serving.embeddings(body, request))

    @router.post("/pooling", dependencies=[guard("/pooling")])
    async def create_pooling(body: PoolingRequest, request: Request) -> Any:
        return json_response(await serving.pooling(body, request))

    @router.post("/classify", dependencies=[guard("/classify")])
    async def create_classify(body: ClassificationRequest, request: Request) -> Any:
        return json_response(await serving.classify(body, request))

    return router
