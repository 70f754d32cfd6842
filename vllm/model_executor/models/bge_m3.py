"""BGE-M3: one XLM-R encoder, three outputs (dense, lexical/sparse, multi-vector).

Served as upstream's `BgeM3EmbeddingModel` (`hf_overrides={"architectures":
["BgeM3EmbeddingModel"]}` on the hub's `XLMRobertaModel` checkpoint). Beside the
safetensors lie two torch files, each one linear layer: `sparse_linear.pt` (hidden -> 1)
and `colbert_linear.pt` (hidden -> hidden). The engine's pooling task picks the output:

- embed: the normalised CLS state (plain CLS pooling, as any XLM-R embedder);
- token_classify: relu(sparse_linear(h)) per token, the first (BOS) and last (EOS) token
  dropped: one weight per remaining token (clients max-pool them per token id);
- token_embed: colbert_linear(h) per token, BOS dropped, EOS kept, normalised.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vllm.model_executor.models.roberta import RobertaModel

EXTRA_FILES = ("sparse_linear.pt", "colbert_linear.pt")


class BgeM3EmbeddingModel(RobertaModel):
    """The XLM-R backbone plus BGE-M3's sparse and ColBERT projections."""

    def __init__(self, config) -> None:
        super().__init__(config)
        h = config.hidden_size
        self.sparse_linear = nn.Linear(h, 1)
        self.colbert_linear = nn.Linear(h, h)
        self.bos_token_id = getattr(config, "bos_token_id", 0)
        self.eos_token_id = getattr(config, "eos_token_id", 2)

    def own_parameters(self) -> set[str]:
        """Parameters that come from the extra files, not from the safetensors."""
        return {f"{layer}.{kind}" for layer in ("sparse_linear", "colbert_linear")
                for kind in ("weight", "bias")}

    def load_extra(self, path: Path, device: str) -> None:
        """Load `sparse_linear.pt` and `colbert_linear.pt` from the checkpoint directory."""
        for file, layer in zip(EXTRA_FILES, (self.sparse_linear, self.colbert_linear)):
            if not (path / file).is_file():
                raise ValueError(f"BgeM3EmbeddingModel needs {file} beside the weights in "
                                 f"{path}; it is missing.")
            state = torch.load(path / file, map_location=device, weights_only=True)
            if set(state) != {"weight", "bias"} or state["weight"].shape != \
                    layer.weight.shape:
                raise ValueError(f"{file} must hold a linear layer's weight "
                                 f"{tuple(layer.weight.shape)} and bias; it holds "
                                 f"{ {k: tuple(v.shape) for k, v in state.items()} }.")
            with torch.no_grad():
                layer.weight.copy_(state["weight"])
                layer.bias.copy_(state["bias"])

    def token_weights(self, rows: torch.Tensor, token_ids: list[int],
                      activation: bool) -> torch.Tensor:
        """token_classify: one lexical weight per token, BOS and EOS dropped."""
        start = int(token_ids[0] == self.bos_token_id)
        stop = len(token_ids) - int(len(token_ids) > start and
                                    token_ids[-1] == self.eos_token_id)
        weights = self.sparse_linear(rows[start:stop]).float().squeeze(-1)
        return torch.relu(weights) if activation else weights

    def token_vectors(self, rows: torch.Tensor, token_ids: list[int]) -> torch.Tensor:
        """token_embed before normalisation: the ColBERT projection, BOS dropped."""
        start = int(token_ids[0] == self.bos_token_id)
        return self.colbert_linear(rows[start:]).float()
