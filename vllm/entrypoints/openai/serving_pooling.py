"""POST /v1/embeddings, /pooling and /classify: one engine request per input."""
from __future__ import annotations

import time
from typing import Any, Optional

import torch
from fastapi import APIRouter, Request
from fastapi.responses import Response

from vllm.engine.pooling_request import PoolingRequest, tokenization_fields
from vllm.entrypoints.openai.protocol import (ClassificationRequest, EmbeddingRequest,
                                              PoolingRequest as PoolingBody)
from vllm.entrypoints.openai.responses import (ClassificationData, ClassificationResponse,
                                               EmbeddingResponse, EmbeddingResponseData,
                                               LateChunkedEmbeddingData,
                                               LateChunkedEmbeddingResponse, TokenEmbeddingData,
                                               TokenEmbeddingResponse, PoolingResponse,
                                               PoolingResponseData, UsageInfo)
from vllm.entrypoints.openai.encoding import BYTE_FORMATS, bytes_response, to_json_value
from vllm.entrypoints.openai.errors import bad_request
from vllm.entrypoints.openai.serving_engine import (ServingContext, json_response,
                                                   list_response)
from vllm.entrypoints.openai.serving_media import message_prompts
from vllm.entrypoints import late_chunking
from vllm.entrypoints.embed_options import CALIBRATED, Calibration, EmbedOptions, OptionError
from vllm.entrypoints.sparse import check_lexical, lexical_weights
from vllm.outputs import sparse_weights
from vllm.tasks import PoolingTask


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
        self._calibration: Optional[Calibration] = None  # the engine's, read on first need

    async def encode(self, http: Request, route: str, body: Any, prefix: str,
                     **param_fields: Any) -> tuple[str, str, list[Any]]:
        """Run `body`'s inputs as `route`'s task through the shared front (prompt applied,
        tokenized, truncated): (the model name to answer with, the response id, the
        outputs)."""
        ctx = self.ctx
        model, adapter = ctx.resolve_model(body.model)
        task = ctx.task_for(route)
        if getattr(body, "task", None) is not None:  # /pooling may name the task
            task = ctx.check_task(body.task)
        elif route == "/pooling":
            task = ctx.model_config.encode_task
        params = ctx.make_params(task, **param_fields)
        inputs = ctx.input_prompts(body.input) if getattr(body, "messages", None) is None \
            else await message_prompts(ctx, body.messages, body.add_generation_prompt)
        request = PoolingRequest.of(inputs, task, params, lora=adapter,
                                   **tokenization_fields(body))
        request = await ctx.apply_prompt(request, getattr(body, "prompt_name", None),
                                         getattr(body, "prompt", None),
                                         default=task == PoolingTask.EMBED)
        response_id = ctx.response_id(http, prefix, body)
        return model, response_id, await ctx.submit(http, request, response_id)

    def _options(self, body: EmbeddingRequest) -> EmbedOptions:
        """The request's output options, checked as `LLM.embed` checks them, plus the
        server's own: embed_dtype is for floats, sparse answers are JSON floats."""
        try:
            options = EmbedOptions.of(body.precision, body.ranges, body.sparse)
            options.check(self.ctx.model_config)
        except OptionError as exc:
            raise bad_request(str(exc), exc.param) from exc
        if options.precision != "float32" and body.embed_dtype != "float32":
            raise bad_request(f"embed_dtype applies to float embeddings; precision "
                              f"{options.precision!r} sends its own integer values. Leave "
                              "embed_dtype unset.", "embed_dtype")
        if options.sparse and body.encoding_format != "float":
            raise bad_request("sparse embeddings are JSON objects of float weights; use "
                              "encoding_format 'float' with sparse.", "encoding_format")
        return options

    def _values(self, options: EmbedOptions, outputs: list[Any]) -> list[Any]:
        """The items to send: float tensors, or `precision`'s quantized arrays."""
        if options.precision not in CALIBRATED:
            return options.quantize([o.outputs.data for o in outputs], Calibration(None))
        path = self.ctx.model_config.embedding_calibration
        if self._calibration is None or self._calibration.path != path:
            self._calibration = Calibration(path)
        try:
            return options.quantize([o.outputs.data for o in outputs], self._calibration)
        except OptionError as exc:
            raise bad_request(str(exc), exc.param) from exc

    def _bytes(self, body: Any, rid: str, model: str, outputs: list[Any],
               values: list[Any]) -> Response:
        usage = UsageInfo.of(prompt_tokens(outputs))
        return bytes_response(values, response_id=rid, created=int(time.time()),
                              model=model, usage=usage.model_dump(),
                              encoding_format=body.encoding_format,
                              embed_dtype=body.embed_dtype, endianness=body.endianness)

    def _check_late_chunking(self, body: EmbeddingRequest) -> None:
        """A 400 naming the field when late chunking cannot serve `body`: non-float
        output, `dimensions`, truncation, padding, a prompt prefix, non-text inputs."""
        if body.encoding_format != "float" or body.embed_dtype != "float32" or \
                body.precision not in (None, "float32") or body.sparse:
            field = "encoding_format" if body.encoding_format != "float" else \
                "embed_dtype" if body.embed_dtype != "float32" else \
                "precision" if body.precision not in (None, "float32") else "sparse"
            raise bad_request("late_chunking_params returns float vectors: use "
                              "encoding_format 'float' (no embed_dtype, precision or "
                              "sparse).", field)
        if body.dimensions is not None:
            raise bad_request("late_chunking_params does not take dimensions: chunk "
                              "vectors keep the model's width.", "dimensions")
        if body.messages is not None:
            raise bad_request("late_chunking_params requires plain-text `input`, not "
                              "`messages`.", "messages")
        try:
            late_chunking.check_inputs(
                self.ctx.input_prompts(body.input), truncate=body.truncate_prompt_tokens,
                padding=body.padding,
                prompt_applied=body.prompt_name is not None or body.prompt is not None)
        except late_chunking.LateChunkingError as exc:
            raise bad_request(str(exc), exc.param) from exc
        if not body.add_special_tokens:
            raise bad_request("late_chunking_params tokenizes the text with its special "
                              "tokens; leave add_special_tokens true.", "add_special_tokens")

    async def late_chunked(self, body: EmbeddingRequest, http: Request) -> Response:
        """/v1/embeddings with late_chunking_params: the token_embed run of each text, its
        token vectors pooled per chunk, with the chunk ranges."""
        self._check_late_chunking(body)
        ctx = self.ctx
        model, adapter = ctx.resolve_model(body.model)
        if ctx.task_for("/v1/embeddings") != PoolingTask.TOKEN_EMBED:
            raise bad_request("late_chunking_params needs an engine running token_embed "
                              "(--pooler-config '{\"task\": \"token_embed\"}').",
                              "late_chunking_params")
        size = body.late_chunking_params.chunk_size
        wanted = ctx.make_params(PoolingTask.TOKEN_EMBED, normalize=body.normalize,
                                 use_activation=body.use_activation)
        params, normalize = wanted.clone(), bool(wanted.normalize)
        params.normalize = False  # the chunk means are normalised, not the tokens
        texts = ctx.input_prompts(body.input)
        rid = ctx.response_id(http, "embd", body)
        outputs = await ctx.submit(http, PoolingRequest.of(
            texts, PoolingTask.TOKEN_EMBED, params, lora=adapter,
            cache_salt=getattr(body, "cache_salt", None)), rid)
        tokenizer = ctx.engine.processor.tokenizer
        try:
            for o, text in zip(outputs, texts):
                await ctx.engine.run_in_tokenizer_thread(
                    late_chunking.apply, o, late_chunking.LateChunkPlan(text, size, normalize),
                    tokenizer)
        except late_chunking.LateChunkingError as exc:
            raise bad_request(str(exc), exc.param) from exc
        data = (LateChunkedEmbeddingData(index=i, embedding=o.outputs.data.tolist(),
                                         late_chunking=late_chunking.metadata_json(
                                             o.late_chunking))
                for i, o in enumerate(outputs))
        return list_response(LateChunkedEmbeddingResponse(
            id=rid, model=model, data=[],
            usage=UsageInfo.of(prompt_tokens(outputs))), data, len(outputs))

    async def embeddings(self, body: EmbeddingRequest, http: Request) -> Response:
        if body.late_chunking_params is not None:
            return await self.late_chunked(body, http)
        options = self._options(body)
        model, rid, outputs = await self.encode(
            http, "/v1/embeddings", body, "embd", dimensions=body.dimensions,
            normalize=body.normalize, use_activation=body.use_activation)
        values = self._values(options, outputs)
        if body.encoding_format in BYTE_FORMATS:
            return self._bytes(body, rid, model, outputs, values)
        if body.sparse:
            return json_response(EmbeddingResponse(
                id=rid, model=model, usage=UsageInfo.of(prompt_tokens(outputs)),
                data=[EmbeddingResponseData(index=i, embedding=sparse_weights(v))
                      for i, v in enumerate(values)]))
        floats = body.encoding_format == "float"
        if floats and values and isinstance(values[0], torch.Tensor) and values[0].dim() == 2:
            return list_response(TokenEmbeddingResponse(
                id=rid, model=model, data=[], usage=UsageInfo.of(prompt_tokens(outputs))),
                (TokenEmbeddingData(index=i, embedding=v.tolist())
                 for i, v in enumerate(values)), len(values))
        data = (EmbeddingResponseData(index=i, embedding=as_list(v) if floats and isinstance(
            v, torch.Tensor) else to_json_value(v, body.encoding_format, body.embed_dtype,
                                                body.endianness))
            for i, v in enumerate(values))
        return list_response(EmbeddingResponse(
            id=rid, model=model, data=[], usage=UsageInfo.of(prompt_tokens(outputs))),
            data, len(values))

    async def pooling(self, body: PoolingBody, http: Request) -> Response:
        # Parameters that belong to another task (e.g. dimensions) are refused by name.
        if body.precision is not None or body.ranges is not None:
            raise bad_request("precision applies to /v1/embeddings only.", "precision")
        if body.late_chunking_params is not None:
            raise bad_request("late_chunking_params applies to /v1/embeddings only.",
                              "late_chunking_params")
        mc = self.ctx.model_config
        if body.sparse:  # BGE-M3's lexical weights, {token_id: weight}
            try:
                check_lexical(mc, body.task or mc.encode_task)
            except ValueError as exc:
                raise bad_request(str(exc), "sparse") from exc
            if body.encoding_format != "float":
                raise bad_request("sparse weights are JSON objects; use encoding_format "
                                  "'float' with sparse.", "encoding_format")
        model, rid, outputs = await self.encode(
            http, "/pooling", body, "pool", softmax=body.softmax,
            use_activation=body.use_activation, dimensions=body.dimensions,
            normalize=body.normalize)
        values = [o.outputs.data for o in outputs]
        if body.sparse:
            data = (PoolingResponseData(index=i, data=lexical_weights(
                mc, o.prompt_token_ids, o.outputs.data)) for i, o in enumerate(outputs))
            return list_response(PoolingResponse(
                id=rid, model=model, data=[], usage=UsageInfo.of(prompt_tokens(outputs))),
                data, len(values))
        if body.encoding_format in BYTE_FORMATS:
            return self._bytes(body, rid, model, outputs, values)
        data = (PoolingResponseData(index=i, data=to_json_value(
            v, body.encoding_format, body.embed_dtype, body.endianness))
            for i, v in enumerate(values))
        return list_response(PoolingResponse(
            id=rid, model=model, data=[], usage=UsageInfo.of(prompt_tokens(outputs))),
            data, len(values))

    async def classify(self, body: ClassificationRequest, http: Request) -> Response:
        model, rid, outputs = await self.encode(
            http, "/classify", body, "classify", activation=body.activation,
            use_activation=body.use_activation)
        id2label = self.ctx.model_config.id2label

        def item(i: int, probs: list[float]) -> ClassificationData:
            best = max(range(len(probs)), key=probs.__getitem__)
            return ClassificationData(index=i, label=id2label.get(best, f"LABEL_{best}"),
                                      probs=probs, num_classes=len(probs))
        data = (item(i, as_list(o.outputs.data)) for i, o in enumerate(outputs))
        return list_response(ClassificationResponse(
            id=rid, model=model, data=[], usage=UsageInfo.of(prompt_tokens(outputs))),
            data, len(outputs))


def make_router(serving: ServingPooling) -> APIRouter:
    router = APIRouter()
    post = serving.ctx.post
    post(router, "/v1/embeddings", EmbeddingRequest, serving.embeddings)
    post(router, "/pooling", PoolingBody, serving.pooling)
    post(router, "/classify", ClassificationRequest, serving.classify)
    return router
