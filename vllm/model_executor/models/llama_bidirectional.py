"""Bidirectional Llama: llama-nemotron-embed (`LlamaBidirectionalModel`) and nemotron-rerank
(`LlamaBidirectionalForSequenceClassification`), upstream 0.33's names.

The checkpoints are Llama weights run with every token attending to every other one (the
project's decoder with causal attention off). Upstream pools as the config's `pooling`
field says (avg: MEAN, cls: CLS, last: LAST); every published checkpoint says avg, the
class default here. The reranker adds a `score` linear head on the pooled state and takes
its pooling from that field (`registry.config_pooling_type`). The registry entries are not
causal, so the gate turns prefix caching and chunked prefill off and no KV cache is kept.

The hub's config.json names model_type `llama_bidirec`, whose config class ships with the
checkpoint; transformers reads it only with remote code (or with model_type `llama`).
"""
from __future__ import annotations

from vllm.model_executor.models.llama import LlamaModel


class LlamaBidirectionalModel(LlamaModel):
    """The Llama decoder with bidirectional attention (the runner's metadata says
    `causal=False` because the registry entry is not causal); the classifier variant is the
    same backbone with the decoder family's `score` head (`build_classifier`)."""

    default_pooling_type = "MEAN"
    is_causal = False
