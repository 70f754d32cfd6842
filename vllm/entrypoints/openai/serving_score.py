"""POST /score, /v1/score, /rerank, /v1/rerank, /v2/rerank.

Cross-encoders score each (text_1, text_2) pair in the tokenizer's pair form, or through a
score template (--chat-template; `instruction` / `chat_template_kwargs` fill it; a
vision-language reranker's items may hold images); embedding models embed each text once
and score by cosine similarity, so a query shared by N documents is computed (and counted
in usage) once.
"""
from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from vllm.engine.pooling_request import PoolingRequest
from vllm.engine.windows import best_of_windows, pair_windows, text_windows
from vllm.entrypoints.openai.errors import bad_request
from vllm.entrypoints.openai.protocol import LongInputFields, RerankRequest, ScoreRequest
from vllm.entrypoints.openai.responses import (RerankDocument, RerankResponse, RerankResult,
                                               RerankUsage, ScoreResponse, ScoreResponseData,
                                               UsageInfo)
from vllm.entrypoints.openai.serving_engine import ServingContext, json_response
from vllm.entrypoints.openai.serving_media import item_prompts
from vllm.entrypoints.openai.serving_pooling import prompt_tokens
from vllm.entrypoints.score_utils import cosine_score, maxsim, pair_texts
from vllm.tasks import PoolingTask


def pair_up(text_1: list[str], text_2: list[str]) -> list[tuple[int, int]]:
    """Index pairs for 1→1, 1→N (the first text shared) and N→N; anything else is a 400."""
    try:
        pair_texts(text_1, text_2)
    except ValueError as exc:
        raise bad_request(str(exc), "text_2" if text_1 else "text_1") from exc
    if len(text_1) == 1:
        return [(0, j) for j in range(len(text_2))]
    return [(i, i) for i in range(len(text_1))]


class ServingScores:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    def _caps(self, body: LongInputFields) -> tuple[int, int]:
        processor = self.ctx.engine.processor
        caps = []
        for name in ("max_tokens_per_query", "max_tokens_per_doc"):
            try:
                caps.append(processor.check_cap(getattr(body, name), name))
            except ValueError as exc:
                raise bad_request(str(exc), name) from exc
        return caps[0], caps[1]

    async def _scores(self, http: Request, route: str, text_1: list[str], text_2: list[str],
                      body: LongInputFields, activation: Optional[bool],
                      use_activation: Optional[bool], base_id: str,
                      adapter: Any = None) -> tuple[list[float], int]:
        """Scores in pair order, plus the prompt tokens processed."""
        ctx = self.ctx
        ctx.task_for(route)
        pairs = pair_up(text_1, text_2)
        rerank = "rerank" in route  # images: {"content": [parts]} items (dual encoders)
        text_1 = await item_prompts(ctx, text_1, "query" if rerank else "text_1")
        text_2 = await item_prompts(ctx, text_2, "documents" if rerank else "text_2")
        truncate, side = body.truncate_prompt_tokens, body.truncation_side
        ctx.check_truncation(truncate, side)
        cap_q, cap_d = self._caps(body)
        processor = ctx.engine.processor
        if ctx.model_config.is_cross_encoder:
            params = ctx.make_params(PoolingTask.SCORE, activation=activation,
                                     use_activation=use_activation)
            if cap_q:
                text_1 = await ctx.engine.run_in_tokenizer_thread(
                    lambda: [processor.cap_item(t, cap_q, side) for t in text_1])
            outputs = await ctx.submit(http, PoolingRequest.of(
                [(text_1[i], text_2[j]) for i, j in pairs], PoolingTask.SCORE, params,
                lora=adapter, pairs=True, truncate_prompt_tokens=truncate,
                truncation_side=side, max_tokens_2=cap_d,
                chat_template_kwargs=body.template_kwargs(), cache_salt=body.cache_salt),
                base_id, param=None)
            scores = [float(o.outputs.data.reshape(-1)[0]) for o in outputs]
            return scores, prompt_tokens(outputs)
        if body.template_kwargs() is not None:
            raise bad_request("chat_template_kwargs and instruction fill a cross-encoder's "
                              "score template; this model scores by embedding similarity.",
                              "chat_template_kwargs")
        if activation is not None or use_activation is not None:
            raise bad_request("activation only applies to cross-encoder models; this model "
                              "scores by cosine similarity of embeddings.", "activation")
        multi = ctx.model_config.late_interaction  # ColBERT: MaxSim of token vectors
        task = PoolingTask.TOKEN_EMBED if multi else PoolingTask.EMBED
        params = ctx.make_params(task)
        sides = [PoolingRequest.of(texts, task, params, lora=adapter, truncation_side=side,
                                  cache_salt=body.cache_salt,
                                  truncate_prompt_tokens=processor.cap_as_truncation(cap,
                                                                                     truncate))
                 for texts, cap in ((text_1, cap_q), (text_2, cap_d))]
        prompts = await ctx.tokenize(sides[0], None) + await ctx.tokenize(sides[1], None)
        outputs = await ctx.run(http, PoolingRequest.of(
            text_1 + text_2, task, params, lora=adapter, cache_salt=body.cache_salt),
            prompts, base_id, param=None)
        first, second = outputs[:len(text_1)], outputs[len(text_1):]
        if multi:
            scores = [float(maxsim(first[i].outputs.data, second[j].outputs.data))
                      for i, j in pairs]
            return scores, prompt_tokens(outputs)
        scores = [float(cosine_score(first[i].outputs.data.reshape(-1),
                                     second[j].outputs.data.reshape(-1))) for i, j in pairs]
        return scores, prompt_tokens(outputs)

    async def _window_scores(self, http: Request, route: str, query: str, docs: list[str],
                             body: RerankRequest, windows: int, base_id: str,
                             adapter: Any = None) -> tuple[list[float], int]:
        """Each document's score: the best of its (query, window) scores (cross-encoder) or
        of its windows' cosines with the query (embedding model)."""
        ctx = self.ctx
        ctx.task_for(route)
        for name in ("max_tokens_per_query", "max_tokens_per_doc", "truncation_side"):
            if getattr(body, name):
                raise bad_request(f"{name} cuts a text, windows cover it whole: with "
                                  "max_chunks_per_doc, leave it unset.", name)
        if body.template_kwargs() is not None:
            raise bad_request("rerank windows score the tokenizer's pair form, which has no "
                              "template to fill: leave chat_template_kwargs and instruction "
                              "unset.", "chat_template_kwargs")
        truncate = body.truncate_prompt_tokens
        ctx.check_truncation(truncate)
        processor, cross = ctx.engine.processor, ctx.model_config.is_cross_encoder

        def work() -> list[list[Any]]:
            if cross:
                return [pair_windows(processor, query, d, windows, truncate) for d in docs]
            return [text_windows(processor, t, n, truncate)
                    for t, n in [(query, 1)] + [(d, windows) for d in docs]]
        try:
            groups = await ctx.engine.run_in_tokenizer_thread(work)
        except ValueError as exc:
            raise bad_request(str(exc), "query") from exc
        flat = [p for group in groups for p in group]
        ctx.limits.check_tokens(flat, None)
        task = PoolingTask.SCORE if cross else PoolingTask.EMBED
        params = ctx.make_params(task, activation=body.activation,
                                 use_activation=body.use_activation) if cross else \
            ctx.make_params(task)
        request = PoolingRequest.of(flat, task, params, lora=adapter, cache_salt=body.cache_salt)
        outputs = await self._run_prefix_first(http, request, flat, base_id, cross)
        vectors = [o.outputs.data.reshape(-1) for o in outputs]
        if cross:
            per_window = [float(v[0]) for v in vectors]
        else:  # the query's vector first, then the documents' windows
            per_window = [float(cosine_score(vectors[0], v)) for v in vectors[1:]]
            groups = groups[1:]
        return best_of_windows([len(g) for g in groups], per_window), prompt_tokens(outputs)

    async def _run_prefix_first(self, http: Request, request: PoolingRequest,
                                prompts: list[Any], base_id: str,
                                shared_prefix: bool) -> list[Any]:
        """With prefix caching, the first (query, window) pair runs alone so that every
        other window finds the query's blocks cached instead of computing them alongside."""
        ctx = self.ctx
        cached = ctx.engine.vllm_config.cache_config.enable_prefix_caching
        if not (shared_prefix and cached and len(prompts) > 1):
            return await ctx.run(http, request, prompts, base_id, param=None)
        head, rest = request.split(1)
        first = await ctx.run(http, head, prompts[:1], base_id, param=None)
        return first + await ctx.run(http, rest, prompts[1:], base_id, param=None)

    async def score(self, body: ScoreRequest, http: Request, route: str) -> ScoreResponse:
        model, adapter = self.ctx.resolve_model(body.model)
        text_1 = [body.text_1] if isinstance(body.text_1, (str, dict)) else list(body.text_1)
        text_2 = [body.text_2] if isinstance(body.text_2, (str, dict)) else list(body.text_2)
        rid = self.ctx.response_id(http, "score", body)
        scores, tokens = await self._scores(http, route, text_1, text_2, body, body.activation,
                                            body.use_activation, rid, adapter)
        return ScoreResponse(id=rid, model=model, usage=UsageInfo.of(tokens),
                             data=[ScoreResponseData(index=i, score=s)
                                   for i, s in enumerate(scores)])

    async def rerank(self, body: RerankRequest, http: Request, route: str) -> RerankResponse:
        model, adapter = self.ctx.resolve_model(body.model)
        if not body.documents:
            raise bad_request("documents must not be empty.", "documents")
        rid = self.ctx.response_id(http, "rerank", body)
        windows = body.max_chunks_per_doc
        if windows is None:
            windows = self.ctx.model_config.rerank_max_chunks_per_doc
        if windows < 0:
            raise bad_request(f"max_chunks_per_doc must be 0 (off) or positive; got {windows}.",
                              "max_chunks_per_doc")
        if windows and not all(isinstance(d, str) for d in [body.query, *body.documents]):
            raise bad_request("max_chunks_per_doc windows texts; leave it unset with image "
                              "items.", "max_chunks_per_doc")
        if windows:
            scores, tokens = await self._window_scores(http, route, body.query,
                                                       list(body.documents), body, windows, rid,
                                                       adapter)
        else:
            scores, tokens = await self._scores(http, route, [body.query],
                                                list(body.documents), body, body.activation,
                                                body.use_activation, rid, adapter)
        order = sorted(range(len(scores)), key=lambda k: scores[k], reverse=True)
        if 0 < body.top_n < len(order):
            order = order[:body.top_n]
        results = [RerankResult(
            index=k, relevance_score=scores[k],
            document=_document(body.documents[k]) if body.return_documents else None)
            for k in order]
        return RerankResponse(id=rid, model=model, results=results,
                              usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens))


def _document(item: Any) -> RerankDocument:
    """A result's document: its text, or (an image item) its content as sent."""
    return RerankDocument(text=item) if isinstance(item, str) else \
        RerankDocument(multi_modal=item)


def without_absent_documents(response: RerankResponse) -> dict[str, Any]:
    """`return_documents: false` leaves the `document` key out entirely."""
    data = response.model_dump(mode="json")
    for result in data["results"]:
        if result["document"] is None:
            del result["document"]
    return data


def make_router(serving: ServingScores) -> APIRouter:
    router = APIRouter()

    def score_endpoint(route: str):
        async def create_score(body: ScoreRequest, request: Request) -> Any:
            return json_response(await serving.score(body, request, route))
        return create_score

    def rerank_endpoint(route: str):
        async def create_rerank(body: RerankRequest, request: Request) -> Any:
            return JSONResponse(without_absent_documents(
                await serving.rerank(body, request, route)))
        return create_rerank

    for route in ("/score", "/v1/score"):
        serving.ctx.post(router, route, ScoreRequest, score_endpoint(route))
    for route in ("/rerank", "/v1/rerank", "/v2/rerank"):
        serving.ctx.post(router, route, RerankRequest, rerank_endpoint(route))
    return router
