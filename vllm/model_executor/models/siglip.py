"""SigLIP (`SiglipModel`) as a dual-encoder embedding model: the text tower (bidirectional,
last token, a linear head) and the vision tower (patches, encoder, post-norm, multihead
attention pooling) map into one space. Shared pieces live in clip.py."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm.attention.metadata import AttentionMetadata
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

    def embed_images(self, images, like):
        return self.vision_model(torch.cat([i.pixel_values for i in images]).to(like.device),
                                 like)


class Siglip2VisionEmbeddings(nn.Module):
    """Patches at their native aspect ratio: a linear patch embedding, and the learned
    position grid resized (bilinear, antialiased) to each image's patch grid."""

    def __init__(self, config) -> None:
        super().__init__()
        h, p = config.hidden_size, config.patch_size
        self.patch_embedding = nn.Linear(config.num_channels * p * p, h)
        self.position_embedding = nn.Embedding(config.num_patches, h)
        self.grid = int(config.num_patches ** 0.5)

    def forward(self, patches: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        w = self.position_embedding.weight
        grid = w.reshape(self.grid, self.grid, -1).permute(2, 0, 1)[None].float()
        resized = F.interpolate(grid, size=shape, mode="bilinear", align_corners=False,
                                antialias=True)[0].flatten(1).T
        return self.patch_embedding(patches.to(w.dtype)) + resized.to(w.dtype)


class Siglip2VisionTower(nn.Module):
    """Each image one sequence of its own patch count (no padding, so no mask needed)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.embeddings = Siglip2VisionEmbeddings(config)
        self.encoder = Encoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.head = AttentionPoolingHead(config)

    def forward(self, images: list, like: AttentionMetadata) -> torch.Tensor:
        shapes = [g[1:] for inputs in images for g in inputs.grids]
        patches = torch.cat([i.pixel_values for i in images]).to(like.device)
        lengths = [h * w for h, w in shapes]
        x = torch.cat([self.embeddings(p, s) for p, s in zip(patches.split(lengths), shapes)])
        x = self.post_layernorm(self.encoder(x, segments_meta(lengths, False, like)))
        return torch.cat([self.head(seq[None]) for seq in x.split(lengths)])


class Siglip2EmbeddingModel(SiglipEmbeddingModel):
    """Siglip2Model: SigLIP's text tower; the vision tower at native aspect ratio."""

    def __init__(self, config) -> None:
        DualEncoder.__init__(self)
        self.config = config
        self.text_model = SiglipTextTower(config.text_config)
        self.vision_model = Siglip2VisionTower(config.vision_config)

    def embed_images(self, images, like):
        return self.vision_model(images, like)
