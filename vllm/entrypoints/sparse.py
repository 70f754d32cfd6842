"""The sparse form of SPLADE embeddings, asked for per request (`sparse=True` on
`LLM.embed`, `"sparse": true` on /v1/embeddings): {token_id: weight} of the non-zeros."""
from __future__ import annotations

from vllm.config.model import ModelConfig


def check_sparse(model_config: ModelConfig) -> None:
    """Sparse output exists only for SPLADE models; ValueError otherwise."""
    pooling = model_config.pooler_config.pooling_type
    if pooling != "SPLADE":
        raise ValueError("sparse=True needs a SPLADE model (BertSpladeSparseEmbeddingModel or "
                         f"a sentence-transformers SparseEncoder); this model's pooling is "
                         f"{pooling}. Leave sparse unset.")
