"""Sparse outputs as {token_id: weight} of the non-zeros, asked for per request: SPLADE
embeddings (`sparse=True` on `LLM.embed`, `"sparse": true` on /v1/embeddings) and BGE-M3's
lexical weights (`sparse=True` on `LLM.encode` / `"sparse": true` on /pooling, under the
token_classify task), max-pooled per token id as BGE-M3's own `lexical_weights`."""
from __future__ import annotations

import torch

from vllm.config.model import ModelConfig
from vllm.tasks import PoolingTask


def check_sparse(model_config: ModelConfig) -> None:
    """Sparse output exists only for SPLADE models; ValueError otherwise."""
    pooling = model_config.pooler_config.pooling_type
    if pooling != "SPLADE":
        raise ValueError("sparse=True needs a SPLADE model (BertSpladeSparseEmbeddingModel or "
                         f"a sentence-transformers SparseEncoder); this model's pooling is "
                         f"{pooling}. Leave sparse unset.")


def check_lexical(model_config: ModelConfig, task: str) -> None:
    """Lexical weights exist for BGE-M3 under token_classify only; ValueError otherwise."""
    if model_config.architecture != "BgeM3EmbeddingModel" or task != PoolingTask.TOKEN_CLASSIFY:
        raise ValueError("sparse=True on the pooling API returns BGE-M3's lexical weights: it "
                         "needs BgeM3EmbeddingModel running the token_classify task (this is "
                         f"{model_config.architecture} running {task!r}). Leave sparse unset.")


def lexical_weights(model_config: ModelConfig, token_ids: list[int],
                    weights: torch.Tensor) -> dict[int, float]:
    """{token_id: the largest weight of its tokens} over the positive weights; `weights`
    holds one weight per token after the BOS (the EOS is dropped at its end)."""
    start = int(token_ids[0] == model_config.hf_config.bos_token_id)
    best: dict[int, float] = {}
    for tid, w in zip(token_ids[start:start + len(weights)], weights.tolist()):
        if w > 0 and w > best.get(tid, 0.0):
            best[tid] = w
    return best
