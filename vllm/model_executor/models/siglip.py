"""SigLIP (`SiglipModel`) as a dual-encoder embedding model: the text tower (bidirectional,
last token, a linear head) and the vision tower (patches, encoder, post-norm, multihead
attention pooling) map into one space. Shared pieces live in clip.py."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm.model_executor.attention_metadata import AttentionMetadata
from vllm.model_executor.layers.linear import Linear
from vllm.model_executor.models.clip import DualEncoder, Encoder, TextTower, segments_meta


class SiglipVisionEmbeddings(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        h = config.hidden_size
        self.patch_embedding = nn.Conv2d(config.num_channels, h, config.patch_size,
                                         stride=config.patch_size)
        self.position_embedding = nn.Embedding((config.image_size // config.patch_size) ** 2, h)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype))
        return patches.flatten(2).transpose(1, 2) + self.position_embedding.weight


class PoolingMLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class AttentionPoolingHead(nn.Module):
    """A learned probe attends over an image's patch states (HF `vision_model.head`)."""

    def __init__(self, config) -> None:
        super().__init__()
        h = config.hidden_size
        self.probe = nn.Parameter(torch.empty(1, 1, h))
        self.attention = nn.MultiheadAttention(h, config.num_attention_heads, batch_first=True)
        self.layernorm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.mlp = PoolingMLP(config)
        if config.hidden_act != "gelu_pytorch_tanh":
            raise ValueError(f"SigLIP's pooling head: hidden_act {config.hidden_act!r} is not "
                             "supported (gelu_pytorch_tanh is).")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probe = self.probe.expand(x.shape[0], -1, -1)
        pooled = self.attention(probe, x, x, need_weights=False)[0]
        return (pooled + self.mlp(self.layernorm(pooled)))[:, 0]


class SiglipVisionTower(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.embeddings = SiglipVisionEmbeddings(config)
        self.encoder = Encoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        if not getattr(config, "vision_use_head", True):
            raise ValueError("SigLIP without its attention pooling head (vision_use_head "
                             "false) has no image embedding; it is not supported.")
        self.head = AttentionPoolingHead(config)

    def forward(self, pixels: torch.Tensor, like: AttentionMetadata) -> torch.Tensor:
        x = self.embeddings(pixels)
        b, n, h = x.shape
        x = self.encoder(x.reshape(b * n, h), segments_meta([n] * b, False, like))
        return self.head(self.post_layernorm(x.view(b, n, h)))


class SiglipTextTower(TextTower):
    """HF `text_model`: as CLIP's, plus the `head` projecting the last token's state."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.head = Linear(config.hidden_size, getattr(config, "projection_size",
                                                       config.hidden_size))


class SiglipEmbeddingModel(DualEncoder):
    """SiglipModel: text -> head(last token's state); image -> attention-pooled patches."""

    text_causal = False

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.text_model = SiglipTextTower(config.text_config)
        self.vision_model = SiglipVisionTower(config.vision_config)

    def embed_text(self, ids, positions, meta, lengths):
        hidden = self.text_model(ids, positions, meta)
        last = torch.tensor(meta.query_start_loc[1:], device=hidden.device) - 1
        return self.text_model.head(hidden[last])

    def embed_images(self, pixels, like):
        return self.vision_model(pixels, like)
