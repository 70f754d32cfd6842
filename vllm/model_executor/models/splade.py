"""SPLADE sparse embeddings on a BERT masked-language model.

The embedding of a prompt is one weight per vocabulary entry: the MLM logits of every
token, saturated as log(1 + relu(logit)), then reduced over the tokens (max, SPLADE v2 and
later; or sum). The MLM decoder is tied to the word embeddings, and its bias to
`cls.predictions.bias` (`tied_weights`): a checkpoint holds either name of each pair, or both.

Settings come from the sentence-transformers SpladePooling module when the checkpoint has
one (`splade_pooling`, `splade_activation`, copied onto the HF config at start-up).
"""
from __future__ import annotations

import torch
from torch import nn

from vllm.model_executor.models.bert import BertModel, get_activation
from vllm.model_executor.layers.linear import linear


class _Transform(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        h = config.hidden_size
        self.dense = nn.Linear(h, h)
        self.act = get_activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(h, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(linear(x, self.dense.weight, self.dense.bias, self.act))


class _Predictions(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.transform = _Transform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x))


class _MLMHead(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.predictions = _Predictions(config)


class BertSpladeSparseEmbeddingModel(BertModel):
    """BERT backbone + its MLM head (`cls.predictions`); `sparse_pool` turns one request's
    final hidden states into its vocabulary-size SPLADE vector."""

    default_pooling_type = "SPLADE"
    # Transformers' BertForMaskedLM ties; the decoder's own bias is the one its forward uses.
    tied_weights = {"cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
                    "cls.predictions.decoder.bias": "cls.predictions.bias"}

    def __init__(self, config) -> None:
        super().__init__(config)
        self.cls = _MLMHead(config)
        self.reduce = getattr(config, "splade_pooling", "max")
        self.activation = getattr(config, "splade_activation", "relu")
        if self.reduce not in ("max", "sum") or self.activation not in ("relu", "log1p_relu"):
            raise ValueError(f"SPLADE pooling {self.reduce!r} / activation {self.activation!r} "
                             "is not supported (pooling: max, sum; activation: relu, "
                             "log1p_relu).")

    @staticmethod
    def skip_weight(name: str) -> bool:
        return name.endswith("position_ids") or name.startswith(("pooler.",
                                                                  "cls.seq_relationship."))

    def sparse_pool(self, rows: torch.Tensor) -> torch.Tensor:
        """[n, H] final hidden states of one prompt -> [vocab] SPLADE weights."""
        weights = torch.log1p(torch.relu(self.cls.predictions(rows).float()))
        if self.activation == "log1p_relu":
            weights = torch.log1p(weights)
        return weights.amax(0) if self.reduce == "max" else weights.sum(0)
