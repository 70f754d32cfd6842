"""POST /tokenize and /detokenize: the model's tokenizer, run off the event loop."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from vllm.engine.prompt_types import check_text
from vllm.entrypoints.openai.errors import bad_request
from vllm.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from vllm.entrypoints.openai.responses import DetokenizeResponse, TokenizeResponse
from vllm.entrypoints.openai.serving_engine import ServingContext, json_response


class ServingTokens:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def tokenize(self, body: TokenizeRequest) -> TokenizeResponse:
        self.ctx.check_model(body.model)
        engine = self.ctx.engine
        tokenizer = engine.tokenizer

        def work() -> tuple[list[int], Any]:
            ids = tokenizer.encode(check_text(body.prompt, "prompt"),
                                   add_special_tokens=body.add_special_tokens)
            strs = tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
            return ids, strs
        ids, strs = await engine.run_in_tokenizer_thread(work)
        return TokenizeResponse(count=len(ids), max_model_len=self.ctx.model_config.max_model_len,
                                tokens=ids, token_strs=strs)

    async def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        self.ctx.check_model(body.model)
        engine = self.ctx.engine
        tokenizer = engine.tokenizer
        vocab = len(tokenizer)
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise bad_request(f"Token ids {bad[:8]} are out of the vocabulary "
                              f"(valid ids: 0 to {vocab - 1}).", "tokens")
        text = await engine.run_in_tokenizer_thread(tokenizer.decode, body.tokens)
        return DetokenizeResponse(prompt=text)


def make_router(serving: ServingTokens) -> APIRouter:
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> Any:
        return json_response(await serving.tokenize(body))

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> Any:
        return json_response(await serving.detokenize(body))

    return router
