"""Heads that turn a causal LM backbone into a classifier or a reward model, and
sentence-transformers Dense layers. Parameter names equal the checkpoint's."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vllm.transformers_utils.st_config import DenseSpec


class ScoreHead(nn.Module):
    """`*ForSequenceClassification` on a causal LM: one linear `score` layer."""

    def __init__(self, hidden_size: int, num_labels: int, bias: bool = False) -> None:
        super().__init__()
        self.score = nn.Linear(hidden_size, num_labels, bias=bias)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.score(pooled)


class TokenClassifierHead(nn.Module):
    """`*ForTokenClassification` on an encoder: one linear `classifier`, per token."""

    def __init__(self, hidden_size: int, num_labels: int) -> None:
        super().__init__()
        self.classifier = nn.Linear(hidden_size, num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(hidden)


class RewardHead(nn.Module):
    """Qwen2.5-Math-RM layout: Linear(h, h) -> ReLU -> Linear(h, num_labels), per token."""

    def __init__(self, hidden_size: int, num_labels: int) -> None:
        super().__init__()
        self.score = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.ReLU(),
                                   nn.Linear(hidden_size, num_labels))

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.score(pooled)


_ST_ACTIVATIONS = {"Tanh": torch.tanh, "Identity": lambda x: x, "ReLU": torch.relu,
                   "Sigmoid": torch.sigmoid, "GELU": nn.functional.gelu}


class DenseLayer(nn.Module):
    """A sentence-transformers Dense module: Linear + activation, after pooling."""

    def __init__(self, spec: DenseSpec) -> None:
        super().__init__()
        self.linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        short = spec.activation.rsplit(".", 1)[-1]
        if short not in _ST_ACTIVATIONS:
            raise ValueError(f"Dense activation {spec.activation!r} is not supported "
                             f"(supported: {', '.join(_ST_ACTIVATIONS)})")
        self.act = _ST_ACTIVATIONS[short]
        self.path: Path = spec.path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.linear(x))

    def load(self) -> None:
        from vllm.model_executor.weight_utils import copy_param, iterate_weights
        params = dict(self.linear.named_parameters())
        seen = set()
        for name, tensor in iterate_weights(self.path):
            key = name.split(".")[-1]
            if key not in params:
                raise ValueError(f"Dense weight {name!r} in {self.path} is not linear.weight "
                                 "or linear.bias")
            copy_param(params[key], tensor, name)
            seen.add(key)
        if seen != set(params):
            raise ValueError(f"Dense module at {self.path} is missing {set(params) - seen}")
