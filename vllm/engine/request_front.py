"""The steps every request front runs, once each, whatever protocol it speaks.

`LLM` calls them inline; the server (HTTP, TEI, gRPC) runs the tokenizer-bound ones on its
tokenizer thread. Each takes a `PoolingRequest` and gives a new value back:

    apply_prompt  the sentence-transformers prompt before each text, and its token count
    verified      one PoolingParams checked for the task on this model (a copy)
    verify_all    every distinct PoolingParams of a request verified once
    tokenize      prompts as engine-ready `TokenizedPrompt`s (pairs, padding, salt)
    tokenize_request  the same for a request's prompts, by its `Tokenization`
    per_prompt    the verified params, one private copy per prompt, for submission
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from vllm.engine.pooling_request import PoolingRequest, Tokenization
from vllm.engine.prompt_types import TokenizedPrompt
from vllm.pooling_params import PoolingParams


def prompt_applies(model_config: Any, prompt_name: Optional[str], prompt: Optional[str],
                   default: bool) -> bool:
    """Whether `apply_prompt` may change anything (so a front can skip the thread hop)."""
    return prompt_name is not None or prompt is not None or \
        (default and model_config.default_prompt_name is not None)


def apply_prompt(processor: Any, request: PoolingRequest, prompt_name: Optional[str] = None,
                 prompt: Optional[str] = None, default: bool = False) -> PoolingRequest:
    """`request` with a sentence-transformers prompt before each text: `prompt` (raw), the
    model's prompt named `prompt_name`, else (`default`) its default_prompt_name's, as
    `SentenceTransformer.encode`; its tokenization marks the prompt's leading tokens and,
    on a model with task adapters, the adapter the name selects (even an empty prompt's).
    ValueError for an unknown name, both given, or a prompt on token-id inputs."""
    raw = list(request.prompts)
    prompts = processor.with_prompt(raw, prompt_name, prompt, default)
    adapter = processor.task_adapter(prompt_name, prompt, default)
    marks = {} if adapter is None else {"task_adapter": adapter}
    if prompts is raw:
        return request.tokenized_as(**marks) if marks else request
    n = processor.prompt_len(raw, prompt_name, prompt, default)
    return dataclasses.replace(request, prompts=prompts).tokenized_as(prompt_len=n, **marks)


def verified(params: Optional[PoolingParams], task: str, model_config: Any) -> PoolingParams:
    """A copy of `params` (None: the defaults) verified for `task` on this model. Always
    checked here, even when the caller's were verified before (maybe for another model);
    the engine then takes the copy as it is."""
    p = params.clone() if params is not None else PoolingParams()
    p.verified = False
    p.verify(task, model_config)
    return p


def verify_all(request: PoolingRequest, model_config: Any) -> PoolingRequest:
    """`request` with each distinct PoolingParams verified once (one shared by every
    prompt is checked once, not per prompt)."""
    done: dict[int, PoolingParams] = {}
    params = []
    for p in request.params:
        if id(p) not in done:
            done[id(p)] = verified(p, request.task, model_config)
        params.append(done[id(p)])
    return dataclasses.replace(request, params=params)


def per_prompt(request: PoolingRequest) -> list[PoolingParams]:
    """One private copy of each prompt's verified params (the engine may set fields)."""
    return [p.clone() for p in request.params]


def tokenize(processor: Any, prompts: Sequence[Any], how: Tokenization = Tokenization(),
             pairs: bool = False) -> list[TokenizedPrompt]:
    """`prompts` as token ids, as `how` says: cross-encoder pairs in the
    model's pair form or score template, texts in one fast-tokenizer batch call (token ids
    and prompt dicts one by one), then upstream's padding, the prompt length, the cache
    salt and the task adapter marked on each. ValueError (with `field` where known) for a
    prompt it refuses."""
    k, side = how.truncate_prompt_tokens, how.truncation_side
    if pairs:
        out = [processor.tokenize_score_pair(a, b, k, side, how.max_tokens_2,
                                             chat_template=how.chat_template,
                                             chat_template_kwargs=how.chat_template_kwargs)
               for a, b in prompts]
    elif how.add_special_tokens:
        out = processor.tokenize_many(list(prompts), k, side)
    else:
        out = [processor.tokenize_prompt(p, k, add_special_tokens=False, truncation_side=side)
               for p in prompts]
    if how.padding is not None:
        out = processor.pad(out, how.padding)
    marks = {name: value for name, value in (("prompt_len", how.prompt_len),
                                             ("cache_salt", how.cache_salt),
                                             ("task_adapter", how.task_adapter))
             if value is not None}
    return [dataclasses.replace(p, **marks) for p in out] if marks else out


def tokenize_request(processor: Any, request: PoolingRequest) -> list[TokenizedPrompt]:
    """`tokenize` for a request's prompts, as its `Tokenization` says."""
    return tokenize(processor, request.prompts, request.tokenization, request.pairs)
