"""BERT / RoBERTa masked-LM checkpoints served as embedding models, as upstream 0.33 does.

Many sentence-transformers and domain checkpoints keep the architecture they were trained
from (`BertForMaskedLM`, `RobertaForMaskedLM`); sentence-transformers loads them as the bare
encoder and drops the MLM head. Both are served here the same way: the encoder's hidden
states, pooled CLS unless the checkpoint's sentence-transformers files say otherwise.

- RobertaForMaskedLM: upstream serves it as its RoBERTa embedding model; `lm_head.*` is not
  loaded.
- BertForMaskedLM: upstream's class also keeps the MLM head and answers `token_classify`
  with each token's vocabulary logits (softmax with `activation`). Here `embed` is the
  default task, and `token_classify` (PoolerConfig(task="token_classify")) returns those
  logits, from the head tied to the word embeddings as transformers ties it. SPLADE is
  the same weights with its own pooling (`splade.py`).
"""
from __future__ import annotations

import torch

from vllm.model_executor.models.roberta import RobertaModel
from vllm.model_executor.models.splade import BertSpladeSparseEmbeddingModel


class BertMaskedLMEmbeddingModel(BertSpladeSparseEmbeddingModel):
    """The BERT backbone plus its MLM head (`cls.predictions`, tied as for SPLADE), pooled
    as a BERT embedding model."""

    default_pooling_type = "CLS"

    def token_weights(self, rows: torch.Tensor, token_ids: list[int],
                      activation: bool) -> torch.Tensor:
        """token_classify: [n, vocab] MLM logits of one prompt's tokens (softmax over the
        vocabulary with `activation`, as upstream's token classifier)."""
        logits = self.cls.predictions(rows).float()
        return torch.softmax(logits, dim=-1) if activation else logits


class RobertaMaskedLMEmbeddingModel(RobertaModel):
    """The RoBERTa backbone of a `RobertaForMaskedLM` checkpoint; its `lm_head` is unused."""

    @staticmethod
    def skip_weight(name: str) -> bool:
        return name.endswith("position_ids") or name.startswith(("pooler.", "lm_head."))
