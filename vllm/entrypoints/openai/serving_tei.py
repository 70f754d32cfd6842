"""TEI's routes as thin mappers over the existing serving paths: /embed, /embed_all and
/embed_sparse run `ServingPooling.encode`, /rerank runs `ServingScores.rerank`, /predict
runs the /classify task on texts and pairs, /similarity the embeddings' cosine, and
/tokenize and /decode the tokenizer thread. Each handler returns a `TeiResult`;
tei_front.py runs it for both transports (metrics, TEI's error types), and the HTTP routes
(tei_routes.py) and the gRPC service (vllm/entrypoints/grpc) put it on their wire."""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

from fastapi import Request

from vllm.engine.pooling_request import PoolingRequest
from vllm.entrypoints.openai.protocol import (EmbeddingRequest, PoolingRequest as PoolingBody,
                                              RerankRequest as VllmRerankRequest)
from vllm.entrypoints.openai.serving_pooling import ServingPooling, as_list, prompt_tokens
from vllm.entrypoints.openai.serving_score import ServingScores
from vllm.entrypoints.openai.tei_protocol import (DecodeRequest, EmbedAllRequest,
                                                  EmbedRequest, EmbedSparseRequest,
                                                  PredictRequest, RerankRequest,
                                                  SimilarityParameters, SimilarityRequest,
                                                  TeiError, TokenizeRequest)
from vllm.entrypoints.score_utils import cosine_score
from vllm.entrypoints.sparse import check_sparse
from vllm.outputs import sparse_weights
from vllm.tasks import PoolingTask


class TeiResult(NamedTuple):
    """A route's JSON answer and what TEI's headers report: the characters and tokens
    computed and the number of inputs (0 for a route that runs no model)."""
    body: Any
    chars: int = 0
    tokens: int = 0
    inputs: int = 0


def _chars(items: list[Any]) -> int:
    """TEI counts characters, and a token-id input's length."""
    return sum(len(x) if isinstance(x, (str, list)) else _chars(list(x)) for x in items)


class ServingTei:
    def __init__(self, pooling: ServingPooling, scores: ServingScores,
                 max_client_batch_size: int) -> None:
        self.pooling = pooling
        self.scores = scores
        self.ctx = pooling.ctx
        self.max_client_batch_size = max_client_batch_size

    # ----- the model's kind and the request's shape -----------------------------------
    def kind(self) -> str:
        """TEI's model type: a one-label classifier is a reranker."""
        mc = self.ctx.model_config
        if mc.pooling_task in (PoolingTask.CLASSIFY, PoolingTask.TOKEN_CLASSIFY):
            return "reranker" if mc.num_labels == 1 and mc.scores else "classifier"
        return "embedding"

    def batch(self, inputs: Any, field: str = "inputs", extra: int = 0) -> list[Any]:
        """A batch as a list (a lone text or id list is a batch of one); empty is TEI's
        400, more than --max-client-batch-size its validation error."""
        items = inputs if isinstance(inputs, list) and inputs and \
            not isinstance(inputs[0], int) else [inputs]
        if isinstance(inputs, list) and not inputs:
            raise TeiError("Empty", f"`{field}` cannot be empty")
        size = len(items) + extra
        if size > self.max_client_batch_size:
            raise TeiError("Validation", f"batch size {size} > maximum allowed batch size "
                           f"{self.max_client_batch_size}")
        return items

    @staticmethod
    def truncation(body: Any) -> tuple[Optional[int], str]:
        """TEI's `truncate` (unset: auto-truncate, on) as truncate_prompt_tokens, and its
        direction as the tokenizer's side."""
        return (None if body.truncate is False else -1), body.truncation_direction.lower()

    def _embedding_request(self, items: list[Any], body: Any, **fields: Any) -> Any:
        if any(isinstance(x, list) for x in items) and any(isinstance(x, str) for x in items):
            raise TeiError("Validation", "`inputs` mixes texts and token ids; send one kind")
        k, side = self.truncation(body)
        kind = PoolingBody if "task" in fields else EmbeddingRequest
        return kind(input=items, truncate_prompt_tokens=k, truncation_side=side,
                    prompt_name=getattr(body, "prompt_name", None), **fields)

    # ----- embeddings -----------------------------------------------------------------
    async def _embed(self, http: Request, items: list[Any], body: Any,
                     **params: Any) -> list[Any]:
        _, _, outputs = await self.pooling.encode(
            http, "/v1/embeddings", self._embedding_request(items, body), "embd", **params)
        return outputs

    async def embed(self, body: EmbedRequest, http: Request) -> TeiResult:
        items = self.batch(body.inputs)
        outputs = await self._embed(http, items, body, normalize=body.normalize,
                                    dimensions=body.dimensions)
        return TeiResult([as_list(o.outputs.data) for o in outputs], _chars(items),
                         prompt_tokens(outputs), len(items))

    async def embed_sparse(self, body: EmbedSparseRequest, http: Request) -> TeiResult:
        try:
            check_sparse(self.ctx.model_config)
        except ValueError as exc:
            raise TeiError("Backend", str(exc)) from None
        items = self.batch(body.inputs)
        outputs = await self._embed(http, items, body)
        data = [[{"index": i, "value": v} for i, v in sparse_weights(
            o.outputs.data.reshape(-1)).items()] for o in outputs]
        return TeiResult(data, _chars(items), prompt_tokens(outputs), len(items))

    async def embed_all(self, body: EmbedAllRequest, http: Request) -> TeiResult:
        if PoolingTask.TOKEN_EMBED not in self.ctx.model_config.supported_tasks:
            raise TeiError("Backend", "/embed_all needs a model that runs the token_embed "
                           "task (start it with --pooler-config '{\"task\": \"token_embed\"}')")
        items = self.batch(body.inputs)
        request = self._embedding_request(items, body, task=PoolingTask.TOKEN_EMBED.value)
        _, _, outputs = await self.pooling.encode(http, "/pooling", request, "pool")
        return TeiResult([o.outputs.data.float().tolist() for o in outputs], _chars(items),
                         prompt_tokens(outputs), len(items))

    async def similarity(self, body: SimilarityRequest, http: Request) -> TeiResult:
        sentences = body.inputs.sentences
        if not sentences:
            raise TeiError("Empty", "`inputs.sentences` cannot be empty")
        self.batch(sentences, extra=1)  # the source sentence counts too
        params = body.parameters or SimilarityParameters()
        items = [body.inputs.source_sentence, *sentences]
        outputs = await self._embed(http, items, params)
        vectors = [o.outputs.data.reshape(-1) for o in outputs]
        scores = [float(cosine_score(vectors[0], v)) for v in vectors[1:]]
        return TeiResult(scores, _chars(items), prompt_tokens(outputs), len(items))

    # ----- classification and reranking -----------------------------------------------
    async def predict(self, body: PredictRequest, http: Request) -> TeiResult:
        ctx = self.ctx
        task = ctx.task_for("/classify")
        single = isinstance(body.inputs, str) or \
            bool(body.inputs) and isinstance(body.inputs[0], str)
        items = [[body.inputs] if isinstance(body.inputs, str) else list(body.inputs)] \
            if single else self.batch(body.inputs)
        params = ctx.make_params(task, activation=not body.raw_scores)
        k, side = self.truncation(body)
        texts = [i for i, item in enumerate(items) if len(item) == 1]
        pairs = [i for i, item in enumerate(items) if len(item) == 2]
        prompts: list[Any] = [None] * len(items)
        for indices, request in (
                (texts, PoolingRequest.of([items[i][0] for i in texts], task, params,
                                         truncate_prompt_tokens=k, truncation_side=side)),
                (pairs, PoolingRequest.of([tuple(items[i]) for i in pairs], task, params,
                                         pairs=True, truncate_prompt_tokens=k,
                                         truncation_side=side))):
            if indices:
                done = await ctx.tokenize(request, "inputs" if not request.pairs else None)
                for i, p in zip(indices, done):
                    prompts[i] = p
        outputs = await ctx.run(http, PoolingRequest.of(items, task, params), prompts,
                                ctx.response_id(http, "predict"), param="inputs")
        labels = ctx.model_config.id2label
        ranked = [sorted(({"score": s, "label": labels.get(j, f"LABEL_{j}")}
                          for j, s in enumerate(as_list(o.outputs.data))),
                         key=lambda p: p["score"], reverse=True) for o in outputs]
        return TeiResult(ranked[0] if single else ranked, _chars(items),
                         prompt_tokens(outputs), len(items))

    async def rerank(self, body: RerankRequest, http: Request) -> TeiResult:
        if not body.texts:
            raise TeiError("Empty", "`texts` cannot be empty")
        if self.kind() != "reranker":
            raise TeiError("Backend", "model is not a re-ranker model")
        self.batch(body.texts, "texts")
        k, side = self.truncation(body)
        request = VllmRerankRequest(query=body.query, documents=list(body.texts),
                                    truncate_prompt_tokens=k, truncation_side=side,
                                    activation=not body.raw_scores, return_documents=False)
        response = await self.scores.rerank(request, http, "/rerank")
        ranks = [{"index": r.index, "score": r.relevance_score} |
                 ({"text": body.texts[r.index]} if body.return_text else {})
                 for r in response.results]
        chars = len(body.query) * len(body.texts) + _chars(body.texts)
        return TeiResult(ranks, chars, response.usage.prompt_tokens, len(body.texts))

    # ----- the tokenizer --------------------------------------------------------------
    async def tokenize(self, body: TokenizeRequest, http: Request) -> TeiResult:
        texts = self.batch(body.inputs)
        engine = self.ctx.engine
        try:
            texts = engine.processor.with_prompt(list(texts), body.prompt_name, None,
                                                 default=False)
        except ValueError as exc:
            raise TeiError("Validation", str(exc)) from None
        tokenizer = engine.tokenizer

        def work() -> list[list[dict]]:
            enc = tokenizer(texts, add_special_tokens=body.add_special_tokens,
                            return_offsets_mapping=True, return_special_tokens_mask=True)
            return [[_token(tokenizer, text, tid, span, special)
                     for tid, span, special in zip(ids, spans, specials)]
                    for text, ids, spans, specials in zip(
                        texts, enc["input_ids"], enc["offset_mapping"],
                        enc["special_tokens_mask"])]
        return TeiResult(await engine.run_in_tokenizer_thread(work))

    async def decode(self, body: DecodeRequest, http: Request) -> TeiResult:
        batches = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]
        self.batch(batches, "ids")
        engine = self.ctx.engine
        tokenizer, vocab = engine.tokenizer, len(engine.tokenizer)
        bad = [t for ids in batches for t in ids if not 0 <= t < vocab]
        if bad:
            raise TeiError("Tokenizer", f"token ids {bad[:8]} are out of the vocabulary "
                           f"(0 to {vocab - 1})")
        return TeiResult(await engine.run_in_tokenizer_thread(
            lambda: [tokenizer.decode(ids, skip_special_tokens=body.skip_special_tokens)
                     for ids in batches]))


def _token(tokenizer: Any, text: str, tid: int, span: tuple[int, int],
           special: int) -> dict[str, Any]:
    """TEI's token object: a special token shows its token string and no offsets; any
    other its text and character offsets in the (prompted) input."""
    if special:
        return {"id": tid, "text": tokenizer.convert_ids_to_tokens(tid), "special": True,
                "start": None, "stop": None}
    start, stop = span
    return {"id": tid, "text": text[start:stop], "special": False, "start": start,
            "stop": stop}
