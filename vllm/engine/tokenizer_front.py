"""Tokenization off the event loop: the part of the server's engine front that needs only a
processor, shared by `AsyncLLM` and the data-parallel front (`vllm.scaleout`)."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence, TypeVar

from vllm.engine import request_front
from vllm.engine.pooling_request import Tokenization

_T = TypeVar("_T")


class TokenizerFront:
    """Tokenization off the event loop, on one worker thread with a processor (and
    tokenizer) of its own. Shared by `AsyncLLM` and the data-parallel front
    (`vllm.scaleout`), which tokenizes without holding an engine."""

    processor: Any
    _tokenizer_pool: ThreadPoolExecutor

    async def run_in_tokenizer_thread(self, fn: Callable[..., _T], *args: Any,
                                      **kwargs: Any) -> _T:
        """Run `fn` on the tokenizer thread; the event loop stays free."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenizer_pool, lambda: fn(*args, **kwargs))

    async def tokenize_request(self, request: Any) -> list[Any]:
        """A PoolingRequest's prompts tokenized as its `Tokenization` says
        (vllm.engine.request_front.tokenize), in one thread hop."""
        return await self.run_in_tokenizer_thread(request_front.tokenize_request,
                                                  self.processor, request)

    async def tokenize_prompts(self, prompts: Sequence[Any],
                               truncate_prompt_tokens: Optional[int] = None,
                               add_special_tokens: bool = True,
                               truncation_side: Optional[str] = None) -> list[Any]:
        """Prompts (str, token ids, or prompt dicts) tokenized in one thread hop."""
        how = Tokenization(truncate_prompt_tokens, truncation_side,
                           add_special_tokens=add_special_tokens)
        return await self.run_in_tokenizer_thread(request_front.tokenize, self.processor,
                                                  prompts, how)

    async def tokenize_pairs(self, pairs: Sequence[tuple[Any, Any]],
                             truncate_prompt_tokens: Optional[int] = None) -> list[Any]:
        """Cross-encoder (text_1, text_2) pairs tokenized in one thread hop."""
        return await self.run_in_tokenizer_thread(
            request_front.tokenize, self.processor, pairs,
            Tokenization(truncate_prompt_tokens), True)
