"""POST /v2/embed: Cohere's embed API on the embeddings path (as upstream serves it).

The request becomes an embeddings request: `input_type` names one of the model's prompts
(sentence-transformers `prompts`; none applies without it), `truncate` END cuts at the
tokenizer's side, START keeps the last tokens (an explicit left side: ids cut as upstream),
NONE refuses a too-long text; `max_tokens` is the cut's length (else `max_model_len`).
Every requested `embedding_types` entry is built from the same float vectors: `binary` =
packbits(x >= 0) - 128, `ubinary` = packbits(x >= 0), `base64` = little-endian float32.
"""
from __future__ import annotations

import base64
from typing import Any, Optional

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from vllm.entrypoints.openai.errors import bad_request
from vllm.entrypoints.openai.protocol import CohereEmbedRequest, EmbeddingRequest
from vllm.entrypoints.openai.serving_pooling import ServingPooling, prompt_tokens


def _typed(vectors: np.ndarray, kind: str) -> list[Any]:
    if kind == "float":
        return vectors.tolist()
    if kind == "base64":
        return [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
    if vectors.shape[1] % 8:
        raise bad_request(f"embedding_types {kind!r} packs 8 dimensions per byte; this "
                          f"embedding has {vectors.shape[1]}.", "embedding_types")
    packed = np.packbits(vectors >= 0, axis=-1)
    return (packed.astype(np.int16) - 128).tolist() if kind == "binary" else packed.tolist()


class ServingCohere:
    def __init__(self, pooling: ServingPooling) -> None:
        self.pooling = pooling

    def _as_embeddings(self, body: CohereEmbedRequest) -> EmbeddingRequest:
        if not body.texts:
            given = [f for f in ("images", "inputs") if getattr(body, f, None) is not None]
            raise bad_request(f"`{given[0]}` is not supported by this server (text models "
                              "only); send `texts`." if given else
                              "Send a non-empty list of `texts`.", given[0] if given else "texts")
        prompts = self.pooling.ctx.model_config.prompts
        if body.input_type is not None and body.input_type not in prompts:
            known = ", ".join(sorted(prompts))
            raise bad_request(f"Unsupported input_type {body.input_type!r}. " + (
                f"Supported values: {known}" if known else
                "This model does not define any input_type task instructions."), "input_type")
        if body.output_dimension is not None:
            try:
                self.pooling.ctx.model_config.verify_dimensions(body.output_dimension)
            except ValueError as exc:
                raise bad_request(str(exc), "output_dimension") from exc
        cut = None if body.truncate == "NONE" else (body.max_tokens or -1)
        return EmbeddingRequest(
            model=body.model, input=list(body.texts), truncate_prompt_tokens=cut,
            truncation_side="left" if body.truncate == "START" else None,
            prompt_name=body.input_type, prompt="" if body.input_type is None else None)

    async def embed(self, body: CohereEmbedRequest, http: Request) -> Response:
        request = self._as_embeddings(body)
        _, rid, outputs = await self.pooling.encode(
            http, "/v2/embed", request, "embd", dimensions=body.output_dimension)
        self._check_max_tokens(body, outputs)
        vectors = np.stack([o.outputs.data.float().numpy() for o in outputs])
        embeddings = {kind: _typed(vectors, kind) for kind in body.embedding_types or ["float"]}
        return JSONResponse({
            "id": rid, "embeddings": embeddings, "texts": list(body.texts),
            "meta": {"api_version": {"version": "2"},
                     "billed_units": {"input_tokens": prompt_tokens(outputs),
                                      "image_tokens": 0}},
            "response_type": "embeddings_by_type"})

    @staticmethod
    def _check_max_tokens(body: CohereEmbedRequest, outputs: list[Any]) -> None:
        """truncate NONE with max_tokens: a text over it is a 400 (nothing was cut)."""
        limit: Optional[int] = body.max_tokens if body.truncate == "NONE" else None
        for o in outputs if limit is not None else ():
            if len(o.prompt_token_ids) > limit:
                raise bad_request(f"Input of {len(o.prompt_token_ids)} tokens exceeds "
                                  f"max_tokens={limit} with truncate=NONE. Set truncate to "
                                  "END or START to allow truncation.", "max_tokens")


def make_router(serving: ServingCohere) -> APIRouter:
    router = APIRouter()
    serving.pooling.ctx.post(router, "/v2/embed", CohereEmbedRequest, serving.embed)
    return router
