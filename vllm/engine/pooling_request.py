"""PoolingRequest: one call's worth of pooling work, typed, as a front hands it on.

A front (`LLM`'s methods; the server's handlers) maps its arguments or body onto one of
these: the prompts, the task (vllm.tasks), one PoolingParams per prompt (None: the model's
defaults), how to tokenize (truncation, its side, upstream's padding, the leading tokens
that are a sentence-transformers prompt) and the adapter(s). Immutable: a step that
changes it makes a new one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from vllm.pooling_params import PoolingParams
from vllm.tasks import PoolingTask


@dataclass(frozen=True)
class PoolingRequest:
    prompts: Sequence[Any]                       # PromptType each (text, ids, dict)
    task: PoolingTask
    params: Sequence[Optional[PoolingParams]]    # one per prompt
    truncate_prompt_tokens: Optional[int] = None
    truncation_side: Optional[str] = None        # "left" | "right" | None (tokenizer's)
    padding: Optional[str] = None                # upstream's (vllm.engine.padding)
    prompt_len: Optional[int] = None             # leading tokens that are an ST prompt
    lora: Any = None                             # a LoRARequest, or one per prompt

    def __post_init__(self) -> None:
        if len(self.params) != len(self.prompts):
            raise ValueError(f"Got {len(self.params)} PoolingParams for "
                             f"{len(self.prompts)} prompts; pass one, or one per prompt.")

    @classmethod
    def of(cls, prompts: Sequence[Any], task: PoolingTask, params: Any = None,
           **fields: Any) -> "PoolingRequest":
        """`params`: None or one PoolingParams for every prompt, else one per prompt."""
        if params is None or isinstance(params, PoolingParams):
            params = [params] * len(prompts)
        return cls(list(prompts), PoolingTask(task), list(params), **fields)
