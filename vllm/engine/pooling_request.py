"""PoolingRequest: one call's worth of pooling work, typed, as a front hands it on.

A front (`LLM`'s methods; the server's handlers, HTTP and gRPC alike) maps its arguments or
body onto one of these: the prompts, the task (vllm.tasks), one PoolingParams per prompt
(None: the model's defaults), how to tokenize them (`Tokenization`) and the adapter(s).
`vllm.engine.request_front` then runs the steps every front shares: the sentence-transformers
prompt, verification, tokenization. Immutable: a step that changes one makes a new one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from vllm.pooling_params import PoolingParams
from vllm.tasks import PoolingTask


@dataclass(frozen=True)
class Tokenization:
    """How a request's prompts become token ids: truncation (and its side), upstream's
    `padding`, special tokens, the leading tokens that are a sentence-transformers prompt
    (and the task adapter its name chose, on models with task LoRAs), the prefix-cache
    salt; for cross-encoder pairs, the score template's text and fill-ins and the cap on
    the second text's tokens."""
    truncate_prompt_tokens: Optional[int] = None
    truncation_side: Optional[str] = None        # "left" | "right" | None (tokenizer's)
    padding: Optional[str] = None                # upstream's (vllm.engine.padding)
    add_special_tokens: bool = True
    prompt_len: Optional[int] = None             # leading tokens that are an ST prompt
    task_adapter: Optional[str] = None           # the task LoRA its prompt name chose
    cache_salt: Optional[str] = None             # keeps its cached prefixes apart
    chat_template: Optional[str] = None          # pairs: a score template's text
    chat_template_kwargs: Optional[dict[str, Any]] = None
    max_tokens_2: int = 0                        # pairs: cap on the second text (0: none)


# The Tokenization fields a request body may carry under the same name (a server front
# copies those its body has: `tokenization_fields`).
BODY_FIELDS = ("truncate_prompt_tokens", "truncation_side", "padding", "add_special_tokens",
               "cache_salt")


def tokenization_fields(body: Any, names: Sequence[str] = BODY_FIELDS) -> dict[str, Any]:
    """The tokenization settings a request body (a pydantic model) carries, by name: a new
    tokenization option reaches every route that declares the field in its body."""
    declared = type(body).model_fields
    return {name: getattr(body, name) for name in names if name in declared}


@dataclass(frozen=True)
class PoolingRequest:
    prompts: Sequence[Any]                       # PromptType each, or (a, b) with `pairs`
    task: PoolingTask
    params: Sequence[Optional[PoolingParams]]    # one per prompt
    tokenization: Tokenization = Tokenization()
    lora: Any = None                             # a LoRARequest, or one per prompt
    pairs: bool = False                          # prompts are cross-encoder (a, b) pairs

    def __post_init__(self) -> None:
        if len(self.params) != len(self.prompts):
            raise ValueError(f"Got {len(self.params)} PoolingParams for "
                             f"{len(self.prompts)} prompts; pass one, or one per prompt.")

    @classmethod
    def of(cls, prompts: Sequence[Any], task: PoolingTask, params: Any = None, *,
           lora: Any = None, pairs: bool = False, **tokenization: Any) -> "PoolingRequest":
        """`params`: None or one PoolingParams for every prompt, else one per prompt;
        `tokenization`: `Tokenization`'s fields."""
        if params is None or isinstance(params, PoolingParams):
            params = [params] * len(prompts)
        return cls(list(prompts), PoolingTask(task), list(params), Tokenization(**tokenization),
                   lora, pairs)

    def split(self, n: int) -> tuple["PoolingRequest", "PoolingRequest"]:
        """(the first `n` prompts, the rest) as two requests with the same settings."""
        lora = self.lora
        parts = (lora[:n], lora[n:]) if isinstance(lora, (list, tuple)) else (lora, lora)
        return (dataclasses.replace(self, prompts=self.prompts[:n], params=self.params[:n],
                                    lora=parts[0]),
                dataclasses.replace(self, prompts=self.prompts[n:], params=self.params[n:],
                                    lora=parts[1]))

    def subset(self, indices: Sequence[int]) -> "PoolingRequest":
        """The prompts at `indices` (their params and adapters) with the same settings."""
        lora = self.lora
        if isinstance(lora, (list, tuple)):
            lora = [lora[i] for i in indices]
        return dataclasses.replace(self, prompts=[self.prompts[i] for i in indices],
                                   params=[self.params[i] for i in indices], lora=lora)

    def tokenized_as(self, **changes: Any) -> "PoolingRequest":
        """This request with some of its tokenization fields changed."""
        return dataclasses.replace(self, tokenization=dataclasses.replace(self.tokenization,
                                                                          **changes))
