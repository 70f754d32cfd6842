"""ColBERT multi-vector retrievers: a BERT (`HF_ColBERT`), ModernBERT
(`ColBERTModernBertModel`) or jina rotary XLM-R (`ColBERTJinaRobertaModel`, jina-colbert-v2)
encoder whose every token state is projected to a small vector.

The projection is the checkpoint's `linear` (or `colbert_linear`) weight (its size from
`colbert_dim` / `dim` / `projection_dim` in the config, checked against the weight, else the
weight's shape), or,
in PyLate-style checkpoints without one, the sentence-transformers `1_Dense` module, which
the pooler applies per token. The `token_embed` task L2-normalises each token's vector;
scoring is MaxSim (`vllm.entrypoints.score_utils.maxsim`).
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from vllm.logger import init_logger
from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.models.bert import BertModel
from vllm.model_executor.models.jina_roberta import JinaRobertaModel
from vllm.model_executor.models.modernbert import ModernBertModel
from vllm.model_executor.weight_utils import copy_param

logger = init_logger(__name__)

_DIM_KEYS = ("colbert_dim", "dim", "projection_dim")
_PROJECTION_PREFIXES = ("linear.", "colbert_linear.")


def config_dim(config) -> Optional[int]:
    return next((int(getattr(config, k)) for k in _DIM_KEYS
                 if isinstance(getattr(config, k, None), int)), None)


class _ColBERT:
    """Mixed into an encoder class: its hidden states go through `linear` when the
    checkpoint has one (created at load time, sized by the weight)."""

    default_pooling_type = "ALL"

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata,
                token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        hidden = super().forward(input_ids, positions, meta, token_type_ids)
        linear = self._modules.get("linear")  # set by load_weights when the checkpoint has one
        return hidden if linear is None else linear(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        projection: dict[str, torch.Tensor] = {}

        def encoder_weights():
            for name, tensor in weights:
                if name.startswith(_PROJECTION_PREFIXES):
                    projection["linear." + name.split(".", 1)[1]] = tensor
                else:
                    yield name, tensor

        loaded = super().load_weights(encoder_weights())
        if projection:
            self._build_projection(projection)
            loaded |= set(projection)
        else:
            logger.info("ColBERT: no `linear` projection in the checkpoint; the "
                        "sentence-transformers Dense module (if any) projects each token.")
        return loaded

    def _build_projection(self, tensors: dict[str, torch.Tensor]) -> None:
        weight = tensors["linear.weight"]
        want = config_dim(self.config)
        if want is not None and want != weight.shape[0]:
            raise ValueError(f"ColBERT config says dim {want}, but linear.weight has "
                             f"{weight.shape[0]} rows.")
        self.linear = nn.Linear(weight.shape[1], weight.shape[0],
                                bias="linear.bias" in tensors)
        for name, tensor in tensors.items():
            copy_param(getattr(self.linear, name.split(".", 1)[1]), tensor, name)
        logger.info("ColBERT projection: %d -> %d per token", weight.shape[1], weight.shape[0])


class ColBERTBertModel(_ColBERT, BertModel):
    """Stanford ColBERT's `HF_ColBERT`: `bert.*` + `linear`."""


class ColBERTModernBertModel(_ColBERT, ModernBertModel):
    """ModernBERT ColBERT (e.g. GTE-ModernColBERT): the encoder + `linear` or `1_Dense`."""


class ColBERTJinaRobertaModel(_ColBERT, JinaRobertaModel):
    """jina-colbert-v2: the rotary XLM-R (`roberta.*`, flash layout) + `linear`; its
    width from `colbert_dim` / `dim` / `projection_dim`, else the weight's rows."""
