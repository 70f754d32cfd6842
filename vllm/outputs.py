"""Request outputs, shaped as vLLM's: a base `PoolingRequestOutput` and per-task views."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Optional, TypeVar

import torch


@dataclass
class PoolingOutput:
    """The raw pooler output of one request (float32, on CPU)."""

    data: torch.Tensor


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class SparseEmbeddingOutput:
    """A sparse (SPLADE) embedding: {token_id: weight} of its non-zero weights."""

    embedding: dict[int, float]


def sparse_weights(data: torch.Tensor) -> dict[int, float]:
    """{index: value} of the non-zero entries of a 1-D vector, by index."""
    idx = torch.nonzero(data, as_tuple=True)[0]
    return dict(zip(idx.tolist(), data[idx].tolist()))


@dataclass
class ClassificationOutput:
    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float


@dataclass(frozen=True)
class LateChunk:
    """One late chunk: its tokens [start, end) and the characters of the input text they
    cover (None for a chunk of special tokens only)."""

    token_range: tuple[int, int]
    char_range: Optional[tuple[int, int]]


@dataclass(frozen=True)
class LateChunkingMetadata:
    """Where each chunk vector of a late-chunked request comes from (upstream 0.33's)."""

    chunk_size: int
    input_tokens: int
    chunks: list[LateChunk]
    strategy: str = "fixed_tokens"


@dataclass(frozen=True)
class RequestTiming:
    """Where one request's time went inside the engine front, in seconds; set only on the
    outputs of traced requests (vllm/tracing.py). `queue`: from submission to the first
    step it ran in, less `tokenize`; `inference`: from that step's start to the end of the
    step that finished it (`forward` and `pool` are the parts of those steps)."""

    tokenize: float
    queue: float
    forward: float
    pool: float
    inference: float


_O = TypeVar("_O")


class PoolingRequestOutput(Generic[_O]):
    """One finished request: its ids, prompt tokens, cache use and output."""

    def __init__(self, request_id: str, outputs: _O, prompt_token_ids: list[int],
                 finished: bool = True, num_cached_tokens: int = 0,
                 late_chunking: Optional[LateChunkingMetadata] = None) -> None:
        self.request_id = request_id
        self.late_chunking = late_chunking
        self.outputs = outputs
        self.prompt_token_ids = prompt_token_ids
        self.finished = finished
        self.num_cached_tokens = num_cached_tokens
        self.timing: Optional[RequestTiming] = None  # traced requests only

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(request_id={self.request_id!r}, outputs={self.outputs!r}, "
                f"prompt_token_ids={self.prompt_token_ids}, finished={self.finished}, "
                f"num_cached_tokens={self.num_cached_tokens})")

    @classmethod
    def _convert(cls, base: "PoolingRequestOutput", outputs) -> "PoolingRequestOutput":
        return cls(base.request_id, outputs, base.prompt_token_ids, base.finished,
                   base.num_cached_tokens)


class EmbeddingRequestOutput(PoolingRequestOutput[EmbeddingOutput]):
    @classmethod
    def from_base(cls, base: PoolingRequestOutput) -> "EmbeddingRequestOutput":
        data = base.outputs.data
        if data.dim() != 1:
            raise ValueError("embeddings are one vector per prompt")
        return cls._convert(base, EmbeddingOutput(data.tolist()))

    @classmethod
    def sparse_from_base(cls, base: PoolingRequestOutput) -> "EmbeddingRequestOutput":
        return cls._convert(base, SparseEmbeddingOutput(sparse_weights(base.outputs.data)))


class ClassificationRequestOutput(PoolingRequestOutput[ClassificationOutput]):
    @classmethod
    def from_base(cls, base: PoolingRequestOutput) -> "ClassificationRequestOutput":
        return cls._convert(base, ClassificationOutput(base.outputs.data.tolist()))


class ScoringRequestOutput(PoolingRequestOutput[ScoringOutput]):
    @classmethod
    def from_base(cls, base: PoolingRequestOutput) -> "ScoringRequestOutput":
        data = base.outputs.data
        if data.numel() != 1:
            raise ValueError("a score is one number per pair; the model has more than one label")
        return cls._convert(base, ScoringOutput(float(data.reshape(-1)[0])))
