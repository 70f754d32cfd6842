"""Tokenization off the event loop: the part of the server's engine front that needs only a
processor, shared by `AsyncLLM` and the data-parallel front (`vllm.scaleout`)."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence, TypeVar

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

    async def tokenize_prompts(self, prompts: Sequence[Any],
                               truncate_prompt_tokens: Optional[int] = None,
                               add_special_tokens: bool = True,
                               truncation_side: Optional[str] = None) -> list[Any]:
        """Tokenize every prompt (str, token ids, or a prompt dict) in one thread hop."""
        processor = self.processor

        def work() -> list[Any]:
            if add_special_tokens:  # strings go through the tokenizer in one batch call
                return processor.tokenize_many(list(prompts), truncate_prompt_tokens,
                                               truncation_side)
            return [processor.tokenize_prompt(p, truncate_prompt_tokens=truncate_prompt_tokens,
                                              add_special_tokens=False,
                                              truncation_side=truncation_side)
                    for p in prompts]
        return await self.run_in_tokenizer_thread(work)

    async def tokenize_pairs(self, pairs: Sequence[tuple[str, str]],
                             truncate_prompt_tokens: Optional[int] = None,
                             truncation_side: Optional[str] = None,
                             max_tokens_2: int = 0,
                             template_kwargs: Optional[dict[str, Any]] = None) -> list[Any]:
        """Tokenize (text_1, text_2) pairs in the tokenizer's own pair form (or the model's
        scoring template, whose items may be image prompts, or its score template filled
        with `template_kwargs`)."""
        processor = self.processor

        def work() -> list[Any]:
            return [processor.tokenize_score_pair(a, b, truncate_prompt_tokens, truncation_side,
                                                  max_tokens_2,
                                                  chat_template_kwargs=template_kwargs)
                    for a, b in pairs]
        return await self.run_in_tokenizer_thread(work)
