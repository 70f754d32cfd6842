"""Qwen2-VL as a pooling model (GME / DSE-Qwen2 style embeddings, LAST pooling): the vision
tower turns each image's patches into merged-patch embeddings, which replace the image's
placeholder tokens; then the Qwen2 decoder runs with multimodal rotary positions.

The decoder stays an ordinary causal LM, so prefix caching and chunked prefill stay on: a
step computes the vision tower only for the images whose placeholders it computes, keeps
recent encoder outputs by content hash (`encoder_cache`, 256 MiB: the next chunk of a split image, or
the same image in another request, reuses them), and scatters the rows it needs.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import Linear
from vllm.model_executor.models.clip import segments_meta
from vllm.model_executor.models.decoder import DecoderModel
from vllm.model_executor.weight_utils import copy_param
from vllm.multimodal.lru import TensorLRU

ENCODER_CACHE_BYTES = 256 * 2**20


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class VisionBlock(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        d, heads = config.embed_dim, config.num_heads
        self.heads, self.head_dim = heads, d // heads
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.qkv = Linear(d, 3 * d)
        self.proj = Linear(d, d)
        self.attn = Attention(heads, d // heads, heads)
        hidden = int(d * config.mlp_ratio)
        self.fc1 = Linear(d, hidden)
        self.fc2 = Linear(hidden, d)
        if config.hidden_act != "quick_gelu":
            raise ValueError(f"Qwen2-VL vision hidden_act {config.hidden_act!r} is not "
                             "supported (quick_gelu is).")

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).view(n, 3, self.heads, self.head_dim).unbind(1)
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(x.dtype)
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(x.dtype)
        x = self.proj.forward_add(self.attn(q.reshape(n, -1), k.reshape(n, -1),
                                            v.reshape(n, -1), meta), x)
        y = self.fc1(self.norm2(x))
        return self.fc2.forward_add(y * torch.sigmoid(1.702 * y), x)


class VisionTower(nn.Module):
    """HF `visual`: Conv3d patches, blocks with 2-D rotary, merger of m x m patches."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        d, p, tp = config.embed_dim, config.patch_size, config.temporal_patch_size
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv3d(config.in_channels, d, (tp, p, p), (tp, p, p),
                                          bias=False)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        merged = d * config.spatial_merge_size ** 2
        self.merger = nn.Module()
        self.merger.ln_q = nn.LayerNorm(d, eps=1e-6)
        self.merger.mlp = nn.Sequential(nn.Linear(merged, merged), nn.GELU(),
                                        nn.Linear(merged, config.hidden_size))
        head_dim = d // config.num_heads
        theta = float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", 1e4))
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim // 2, 2,
                                                          dtype=torch.float) / (head_dim // 2)))

    def _rotary(self, grid: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        t, h, w = grid
        m = self.config.spatial_merge_size
        hpos, wpos = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        shape = (h // m, m, w // m, m)
        hpos = hpos.reshape(shape).transpose(1, 2).flatten().repeat(t)
        wpos = wpos.reshape(shape).transpose(1, 2).flatten().repeat(t)
        angles = torch.cat([hpos[:, None] * self.inv_freq, wpos[:, None] * self.inv_freq], -1)
        angles = torch.cat([angles, angles], dim=-1)[:, None, :]  # [N, 1, head_dim]
        return angles.cos(), angles.sin()

    def forward(self, pixels: torch.Tensor, grid: tuple[int, int, int],
                like: AttentionMetadata) -> torch.Tensor:
        """One image's patches [N, C*T*P*P] -> its merged-patch embeddings [N / m^2, H]."""
        c = self.config
        proj = self.patch_embed.proj
        x = proj(pixels.to(proj.weight.dtype).view(-1, c.in_channels, c.temporal_patch_size,
                                                   c.patch_size, c.patch_size))
        x = x.view(-1, c.embed_dim)
        cos, sin = (a.to(x.device) for a in self._rotary(grid))
        meta = segments_meta([x.shape[0]], False, like)
        for block in self.blocks:
            x = block(x, cos, sin, meta)
        merged = self.merger.ln_q(x).view(-1, c.embed_dim * c.spatial_merge_size ** 2)
        return self.merger.mlp(merged)


class Qwen2VLEmbeddingModel(DecoderModel):
    """Qwen2VLForConditionalGeneration served for pooling: forward(input_ids, positions,
    meta, images=...) -> hidden states, image placeholders replaced by the vision tower's
    output, multimodal rotary positions for requests with images."""

    weight_prefix = ""
    tied_weights: dict[str, str] = {}
    qkv_bias = True

    def __init__(self, config) -> None:
        super().__init__(config.text_config)
        self.visual = VisionTower(config.vision_config)
        sections = self.rotary_sections = list(
            config.text_config.rope_parameters.get("mrope_section", []))
        if sum(sections) != self.layers[0].self_attn.head_dim // 2:
            raise ValueError(f"mrope_section {sections} must sum to half the head size.")
        # vision-tower outputs by image content hash (the next chunk of a split image, the
        # same image in another request)
        self.encoder_cache = TensorLRU(ENCODER_CACHE_BYTES)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.layers]

    @staticmethod
    def build_classifier(config, num_labels: int, names: set[str]) -> nn.Module:
        """jina-reranker-m0's two-layer `score` MLP where the checkpoint has one, else the
        usual linear `score` head."""
        from vllm.model_executor.models.adapters import ScoreHead
        hidden = config.text_config.hidden_size
        if "score.0.weight" in names:
            return MLPScoreHead(hidden, num_labels)
        return ScoreHead(hidden, num_labels, bias="score.bias" in names)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, token_type_ids: Optional[torch.Tensor] = None,
                images: Optional[list] = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if images is None:
            rotation = self.rotary.rotations(positions)
        else:
            rotation = self._mrope(positions, meta, images)
            self._scatter_images(x, meta, images)
        for layer in self.layers[:-1]:
            x = layer(x, rotation, meta)
        return self.norm(self.layers[-1](x, rotation, meta, meta.output_rows))

    def _mrope(self, positions: torch.Tensor, meta: AttentionMetadata,
               images: list) -> torch.Tensor:
        """Rotations with each request's (t, h, w) positions: a frequency section per axis."""
        pos3 = positions.expand(3, -1).clone()
        for i, inputs in enumerate(images):
            if inputs is not None:
                k, n, s = meta.num_computed[i], meta.num_new[i], meta.query_start_loc[i]
                pos3[:, s:s + n] = inputs.positions[:, k:k + n].to(pos3.device)
        rots = [self.rotary.rotations(p) for p in pos3]
        cuts = [0]
        for size in self.rotary_sections:
            cuts.append(cuts[-1] + size)
        return torch.cat([rots[j % 3][..., cuts[j]:cuts[j + 1]]
                          for j in range(len(self.rotary_sections))], dim=-1)

    def _scatter_images(self, x: torch.Tensor, meta: AttentionMetadata, images: list) -> None:
        """Replace the placeholder rows this step computes with their images' embeddings."""
        offsets = _patch_offsets
        for i, inputs in enumerate(images):
            if inputs is None:
                continue
            k, n, s = meta.num_computed[i], meta.num_new[i], meta.query_start_loc[i]
            for j, ((start, length), grid) in enumerate(zip(inputs.spans, inputs.grids)):
                lo, hi = max(start, k), min(start + length, k + n)
                if lo >= hi:
                    continue  # not in this step (computed before, or later)
                a, b = offsets(inputs.grids, j)
                emb = self.encoder_cache.get(inputs.hashes[j], lambda: self.visual(
                    inputs.pixel_values[a:b].to(x.device), grid, meta))
                x[s + lo - k: s + hi - k] = emb[lo - start: hi - start].to(x.dtype)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """HF names of either layout (`model.language_model.` / `model.visual.` or the older
        `model.` / `visual.`): the decoder's through DecoderModel's loader."""
        own = dict(self.visual.named_parameters())
        loaded: set[str] = set()
        text = []
        for name, tensor in weights:
            for prefix in ("model.visual.", "visual."):
                if name.startswith(prefix):
                    key = name[len(prefix):]
                    key = key.replace(".attn.qkv.", ".qkv.").replace(".attn.proj.", ".proj.") \
                        .replace(".mlp.fc1.", ".fc1.").replace(".mlp.fc2.", ".fc2.")
                    if key not in own:
                        raise ValueError(f"checkpoint weight {name!r} has no place in the "
                                         "vision tower")
                    copy_param(own[key], tensor, name)
                    loaded.add(f"visual.{key}")
                    break
            else:
                for prefix in ("model.language_model.", "model."):
                    if name.startswith(prefix):
                        name = name[len(prefix):]
                        break
                text.append((name, tensor))
        return loaded | super().load_weights(text)


class MLPScoreHead(nn.Module):
    """`score` = Linear(h, h), ReLU, Linear(h, labels) on the pooled state (jina-reranker-m0)."""

    def __init__(self, hidden: int, num_labels: int) -> None:
        super().__init__()
        self.score = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(),
                                   nn.Linear(hidden, num_labels))

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.score(pooled)


def _patch_offsets(grids: list[tuple[int, int, int]], j: int) -> tuple[int, int]:
    """Rows of image `j`'s patches in a prompt's concatenated pixel values."""
    start = sum(t * h * w for t, h, w in grids[:j])
    t, h, w = grids[j]
    return start, start + t * h * w
