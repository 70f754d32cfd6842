"""Late chunking (upstream 0.33's `late_chunking_params`), shared by `LLM` and the server.

A token_embed request runs over the whole text once; its contextual token vectors (the
model's projection applied, not yet unit length) are then mean-pooled per run of
`chunk_size` tokens, special tokens included, and each mean is L2-normalised when the
request normalises. The tokenizer's offsets give each chunk the characters it covers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

from vllm.outputs import LateChunk, LateChunkingMetadata, PoolingRequestOutput
from vllm.pooling_params import PoolingParams


class LateChunkingError(ValueError):
    """A request late chunking cannot serve; `param` names the field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class LateChunkPlan:
    """What one late-chunked prompt needs after the engine: its text, chunk size and
    whether the chunk means are normalised."""

    text: str
    chunk_size: int
    normalize: bool


def check_inputs(prompts: Sequence[Any], *, truncate: Optional[int] = None,
                 padding: Optional[str] = None, prompt_applied: bool = False) -> list[str]:
    """The prompts as nonempty texts, or a LateChunkingError: chunk ranges need the whole,
    unpadded, unprefixed text."""
    if truncate is not None:
        raise LateChunkingError("late_chunking_params does not support truncation "
                                "(truncate_prompt_tokens).", "truncate_prompt_tokens")
    if padding not in (None, False, "do_not_pad"):
        raise LateChunkingError("late_chunking_params does not support input padding.",
                                "padding")
    if prompt_applied:
        raise LateChunkingError("late_chunking_params does not support a prompt prefix "
                                "(prompt_name / prompt): the ranges are of the input text.",
                                "prompt_name")
    texts = [p.get("prompt") if isinstance(p, dict) and set(p) == {"prompt"} else p
             for p in prompts]
    if not all(isinstance(t, str) and t for t in texts):
        raise LateChunkingError("late_chunking_params requires nonempty plain-text input "
                                "(no token ids, images or chat messages).", "input")
    return texts


def engine_params(params: PoolingParams, task: str, model_config: Any) -> tuple[
        PoolingParams, bool]:
    """(params for the engine: verified, token vectors left unnormalised; whether the
    chunk means are normalised). A bad parameter is a LateChunkingError."""
    params = params.clone()
    params.verified = False
    try:
        params.verify(task, model_config)
    except ValueError as exc:
        raise LateChunkingError(str(exc), _param_of(str(exc))) from exc
    normalize = bool(params.normalize)
    params.normalize = False
    return params, normalize


def _param_of(message: str) -> str:
    return "dimensions" if "dimensions" in message else "late_chunking_params"


def token_offsets(tokenizer: Any, text: str, token_ids: Sequence[int]) -> list[
        tuple[int, int]]:
    """Each token's (start, end) in `text`, from a fast tokenizer; a ValueError when the
    tokenizer gives none or its tokens differ from the engine's."""
    if not getattr(tokenizer, "is_fast", False):
        raise LateChunkingError("late_chunking_params needs a fast tokenizer (offsets).",
                                "late_chunking_params")
    enc = tokenizer(text, return_offsets_mapping=True)
    if list(enc["input_ids"]) != list(token_ids):
        raise LateChunkingError("late_chunking_params: the tokenizer's offsets do not "
                                "align with the request's tokens.", "input")
    return [tuple(o) for o in enc["offset_mapping"]]


def chunk_metadata(offsets: Sequence[tuple[int, int]], chunk_size: int) -> \
        LateChunkingMetadata:
    """The token and character range of each chunk (char_range None when the chunk is
    special tokens only)."""
    n = len(offsets)
    chunks = []
    for start in range(0, n, chunk_size):
        end = min(start + chunk_size, n)
        spans = [(a, b) for a, b in offsets[start:end] if a < b]
        chars = (min(a for a, _ in spans), max(b for _, b in spans)) if spans else None
        chunks.append(LateChunk(token_range=(start, end), char_range=chars))
    return LateChunkingMetadata(chunk_size=chunk_size, input_tokens=n, chunks=chunks)


def pool_chunks(tokens: torch.Tensor, chunk_size: int, normalize: bool) -> torch.Tensor:
    """[n_chunks, dim]: the float32 mean of each run of `chunk_size` token vectors (the
    last run may be shorter), L2-normalised when `normalize`."""
    means = torch.stack([c.float().mean(dim=0) for c in torch.split(tokens, chunk_size)])
    return F.normalize(means, dim=-1) if normalize else means


def apply(output: PoolingRequestOutput, plan: LateChunkPlan, tokenizer: Any) -> None:
    """Turn one finished token_embed output into its chunk vectors and ranges, in place."""
    offsets = token_offsets(tokenizer, plan.text, output.prompt_token_ids)
    output.late_chunking = chunk_metadata(offsets, plan.chunk_size)
    output.outputs.data = pool_chunks(output.outputs.data, plan.chunk_size, plan.normalize)


def metadata_json(meta: LateChunkingMetadata) -> dict[str, Any]:
    """The response's `late_chunking` object."""
    return {"chunk_size": meta.chunk_size, "input_tokens": meta.input_tokens,
            "chunks": [{"token_range": list(c.token_range),
                        "char_range": list(c.char_range) if c.char_range else None}
                       for c in meta.chunks],
            "strategy": meta.strategy}
