"""Embeddings longer than max_model_len, as upstream's chunked processing.

With pooler_config `{"enable_chunked_processing": true, "max_embed_len": N}` an embed
request longer than max_model_len is split into chunks of at most max_model_len tokens.
Each chunk is an engine request of its own (they are queued together, so they share steps
where the token budget allows) and is pooled with the request's parameters; the request's
embedding is the token-weighted mean of its chunks' embeddings, re-normalised when the
parameters normalise. A chunk weighs the tokens it pools over: when the model leaves a
sentence-transformers prompt out of pooling (`include_prompt: false`), the first chunk's
prompt tokens do not count. The output carries every prompt token, so usage counts them all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from vllm.engine.prompt_types import TokenizedPrompt

_SEP = "##chunk"


@dataclass
class _Parent:
    prompt_token_ids: list[int]
    normalize: bool
    waiting: set[str]
    parts: dict[str, tuple[torch.Tensor, int]] = field(default_factory=dict)
    num_cached_tokens: int = 0
    skip: int = 0  # leading tokens of the first chunk left out of pooling (its ST prompt)


@dataclass
class Finished:
    request_id: str
    data: torch.Tensor
    prompt_token_ids: list[int]
    num_cached_tokens: int


class ChunkedInputs:
    def __init__(self, max_model_len: int, pool_prompt: bool = True) -> None:
        self.max_len = max_model_len
        self.pool_prompt = pool_prompt
        self._parents: dict[str, _Parent] = {}

    def split(self, request_id: str, prompt: TokenizedPrompt,
              normalize: bool) -> list[tuple[str, TokenizedPrompt]]:
        """The chunk requests of a long prompt (ids `<request_id>##chunk<i>`)."""
        ids, types = prompt.prompt_token_ids, prompt.token_type_ids
        chunks = []
        for i, start in enumerate(range(0, len(ids), self.max_len)):
            end = start + self.max_len
            chunks.append((f"{request_id}{_SEP}{i}", TokenizedPrompt(
                ids[start:end], types[start:end] if types else None, prompt.cache_salt,
                prompt.prompt_len if i == 0 else None)))
        skip = 0 if self.pool_prompt else prompt.prompt_len or 0
        self._parents[request_id] = _Parent(list(ids), normalize, {c for c, _ in chunks},
                                            skip=skip)
        return chunks

    def finish(self, chunk_id: str, data: torch.Tensor, num_tokens: int,
               num_cached: int) -> Optional[Finished]:
        """Record a finished chunk; the parent's result once its last chunk is in, else
        None. A request id that is not a chunk comes back as it is."""
        parent_id = parent_of(chunk_id)
        parent = self._parents.get(parent_id) if parent_id else None
        if parent is None:
            return Finished(chunk_id, data, [], num_cached)
        parent.waiting.discard(chunk_id)
        first = chunk_id.endswith(f"{_SEP}0")
        # (A prompt filling the whole first chunk pools nothing there: zeros of weight 0.)
        parent.parts[chunk_id] = (data, num_tokens - min(parent.skip, num_tokens) if first
                                  else num_tokens)
        parent.num_cached_tokens += num_cached
        if parent.waiting:
            return None
        del self._parents[parent_id]
        weights = torch.tensor([n for _, n in parent.parts.values()], dtype=torch.float32)
        stacked = torch.stack([d.float() for d, _ in parent.parts.values()])
        mean = (stacked * weights[:, None]).sum(0) / weights.sum()
        if parent.normalize:
            mean = F.normalize(mean, dim=-1)
        return Finished(parent_id, mean, parent.prompt_token_ids, parent.num_cached_tokens)

    def chunk_ids(self, request_ids: set[str]) -> set[str]:
        """The outstanding chunk ids of these parents (forgotten now), for an abort."""
        out = set()
        for rid in request_ids:
            parent = self._parents.pop(rid, None)
            if parent is not None:
                out |= parent.waiting
        return out

    def drop_chunks(self, chunk_ids: set[str]) -> set[str]:
        """Failed chunks: forget their parents; returns the parents' other chunks."""
        parents = {parent_of(c) for c in chunk_ids} - {None}
        return self.chunk_ids(parents) - chunk_ids  # type: ignore[arg-type]


def parent_of(request_id: str) -> Optional[str]:
    head, sep, _ = request_id.rpartition(_SEP)
    return head if sep else None
