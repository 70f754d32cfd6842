"""RoBERTa / XLM-RoBERTa: BERT layers, positions offset past padding_idx, own head."""
from __future__ import annotations

import torch
from torch import nn

from vllm.model_executor.models.bert import BertModel, TokenClassifierMixin
from vllm.transformers_utils.config import roberta_position_offset


class RobertaModel(BertModel):
    """Positions start at padding_idx + 1, as RoBERTa numbers non-padding tokens."""

    weight_prefix = "roberta."

    def _position_offset(self, config) -> int:
        return roberta_position_offset(config)


class _RobertaClassifier(nn.Module):
    def __init__(self, hidden_size: int, num_labels: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.out_proj = nn.Linear(hidden_size, num_labels)


class RobertaClassifierHead(nn.Module):
    def __init__(self, config, num_labels: int) -> None:
        super().__init__()
        self.classifier = _RobertaClassifier(config.hidden_size, num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier.out_proj(torch.tanh(self.classifier.dense(pooled)))


class RobertaForSequenceClassification(RobertaModel):
    @staticmethod
    def skip_weight(name: str) -> bool:
        return name.endswith("position_ids") or name.startswith("pooler.")

    @staticmethod
    def build_classifier(config, num_labels: int, names: set[str]) -> nn.Module:
        return RobertaClassifierHead(config, num_labels)


class RobertaForTokenClassification(TokenClassifierMixin, RobertaModel):
    """RoBERTa / XLM-R for token classification."""
