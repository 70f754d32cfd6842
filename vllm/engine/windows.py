"""Rerank of long documents by windows (Cohere's behaviour, opt-in).

A document whose pair with the query does not fit `max_model_len` is split into windows:
the tokenizer's own overflow (`return_overflowing_tokens`, truncation `only_second`) gives
consecutive slices of the document's tokens, each in the full pair form with the query.
Each window is scored and the document's score is the best window's. At most
`max_windows` windows are kept per document (the rest of a very long document is dropped,
as a truncation would). On an embedding model a document's windows are embedded alone.
"""
from __future__ import annotations

from typing import Optional, Sequence

from vllm.engine.processor import InputProcessor

from vllm.engine.prompt_types import TokenizedPrompt


def _limit(processor: InputProcessor, truncate_prompt_tokens: Optional[int]) -> int:
    k = processor.check_truncation(truncate_prompt_tokens)
    return min(k or processor.mc.max_model_len, processor.mc.max_model_len)


def pair_windows(processor: InputProcessor, query: str, doc: str, max_windows: int,
                 truncate_prompt_tokens: Optional[int] = None) -> list[TokenizedPrompt]:
    """The (query, window) prompts of one document; one prompt when the pair fits."""
    if processor.score_template() is not None:
        raise ValueError("rerank windows cut the tokenizer's pair form; this model scores "
                         "through a score template, so windows cannot be used with it.")
    length = _limit(processor, truncate_prompt_tokens)
    room = length - processor.num_tokens(query) - \
        processor.tokenizer.num_special_tokens_to_add(pair=True)
    if room < 1:
        raise ValueError(f"The query leaves no room for a document window within "
                         f"{length} tokens; shorten the query or pass max_tokens_per_query.")
    enc = processor.encode(query, doc, length, "right", "only_second",
                           return_overflowing_tokens=True)
    return _prompts(processor, enc, max_windows)


def text_windows(processor: InputProcessor, text: str, max_windows: int,
                 truncate_prompt_tokens: Optional[int] = None) -> list[TokenizedPrompt]:
    """One text's windows of at most `max_model_len` tokens each, special tokens included."""
    enc = processor.encode(text, None, _limit(processor, truncate_prompt_tokens), "right",
                           return_overflowing_tokens=True)
    return _prompts(processor, enc, max_windows)


def _prompts(processor: InputProcessor, enc, max_windows: int) -> list[TokenizedPrompt]:
    ids = enc["input_ids"]
    types = enc.get("token_type_ids") if processor.mc.uses_token_type_ids else None
    out = []
    for i in range(min(len(ids), max_windows)):
        prompt = TokenizedPrompt(list(ids[i]), list(types[i]) if types is not None else None)
        processor.check(prompt)
        out.append(prompt)
    return out


def best_of_windows(sizes: Sequence[int], scores: Sequence[float]) -> list[float]:
    """Each document's score, the best of its windows' (`scores`: every window's, flat in
    document order; `sizes`: how many windows each document has)."""
    best, start = [], 0
    for size in sizes:
        best.append(max(scores[start:start + size]))
        start += size
    return best
