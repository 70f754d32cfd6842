"""Response bodies of the OpenAI-compatible server (field names and shapes as vLLM's);
the request bodies are protocol.py's."""
from __future__ import annotations

import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field


def _now() -> int:
    return int(time.time())


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: Optional[Any] = None
    completion_tokens_details: Optional[Any] = None

    @classmethod
    def of(cls, prompt_tokens: int) -> "UsageInfo":
        return cls(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)


class _ListResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=_now)
    model: str
    usage: UsageInfo


class EmbeddingResponseData(BaseModel):
    index: int
    object: Literal["embedding"] = "embedding"
    embedding: Union[list[float], str, dict[int, float]]


class TokenEmbeddingData(BaseModel):
    """A token_embed engine's answer on /v1/embeddings: one vector per token (upstream 0.33)."""

    index: int
    object: Literal["embedding"] = "embedding"
    embedding: list[list[float]]


class TokenEmbeddingResponse(_ListResponse):
    data: list[TokenEmbeddingData]


class LateChunkedEmbeddingData(BaseModel):
    """One input's chunk vectors and where each chunk comes from."""

    index: int
    object: Literal["embedding"] = "embedding"
    embedding: list[list[float]]
    late_chunking: dict[str, Any]


class EmbeddingResponse(_ListResponse):
    data: list[EmbeddingResponseData]


class LateChunkedEmbeddingResponse(_ListResponse):
    data: list[LateChunkedEmbeddingData]


class PoolingResponseData(BaseModel):
    index: int
    object: Literal["pooling"] = "pooling"
    data: Union[list[Any], dict[int, float], float, str]


class PoolingResponse(_ListResponse):
    data: list[PoolingResponseData]


class ClassificationData(BaseModel):
    index: int
    label: Optional[str]
    probs: list[float]
    num_classes: int


class ClassificationResponse(_ListResponse):
    data: list[ClassificationData]


class ScoreResponseData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(_ListResponse):
    data: list[ScoreResponseData]


class RerankDocument(BaseModel):
    text: Optional[str] = None
    multi_modal: Optional[Any] = None


class RerankResult(BaseModel):
    index: int
    document: Optional[RerankDocument] = None
    relevance_score: float


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeResponse(BaseModel):
    prompt: str


class ModelPermission(BaseModel):
    id: str
    object: Literal["model_permission"] = "model_permission"
    created: int = Field(default_factory=_now)
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: Optional[str] = None
    is_blocking: bool = False


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "vllm"
    root: Optional[str] = None
    parent: Optional[str] = None
    max_model_len: Optional[int] = None
    permission: list[ModelPermission] = Field(default_factory=list)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
