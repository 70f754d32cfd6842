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
from vllm.model_executor.models.decoder import DecoderModel
from vllm.model_executor.models.qwen_vision import VisionTower
from vllm.model_executor.weight_utils import copy_param
from vllm.multimodal.lru import TensorLRU

ENCODER_CACHE_BYTES = 256 * 2**20


class Qwen2VLEmbeddingModel(DecoderModel):
    """Qwen2VLForConditionalGeneration served for pooling: forward(input_ids, positions,
    meta, images=...) -> hidden states, image placeholders replaced by the vision tower's
    output, multimodal rotary positions for requests with images."""

    weight_prefix = ""
    tied_weights: dict[str, str] = {}
    qkv_bias = True
    vision_tower: type[nn.Module] = VisionTower

    def __init__(self, config) -> None:
        super().__init__(config.text_config)
        self.visual = self.vision_tower(config.vision_config)
        sections = list(config.text_config.rope_parameters.get("mrope_section", []))
        if sum(sections) != self.layers[0].self_attn.head_dim // 2:
            raise ValueError(f"mrope_section {sections} must sum to half the head size.")
        self.rotary_axes = self.mrope_axes(sections)
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

    @staticmethod
    def mrope_axes(sections: list[int]) -> torch.Tensor:
        """The position axis (0 t, 1 h, 2 w) each rotary frequency reads: Qwen2-VL's
        contiguous sections, section j on axis j % 3."""
        return torch.repeat_interleave(torch.arange(len(sections)) % 3,
                                       torch.tensor(sections))

    def _mrope(self, positions: torch.Tensor, meta: AttentionMetadata,
               images: list) -> torch.Tensor:
        """Rotations with each request's (t, h, w) positions, each frequency from its axis
        (`rotary_axes`)."""
        pos3 = positions.expand(3, -1).clone()
        for i, inputs in enumerate(images):
            if inputs is not None:
                k, n, s = meta.num_computed[i], meta.num_new[i], meta.query_start_loc[i]
                pos3[:, s:s + n] = inputs.positions[:, k:k + n].to(pos3.device)
        rots = torch.stack([self.rotary.rotations(p) for p in pos3])  # [3, T, 1, D/2]
        axes = self.rotary_axes.to(rots.device)
        return rots[axes, :, :, torch.arange(len(axes), device=rots.device)].permute(1, 2, 0)

    def _scatter_images(self, x: torch.Tensor, meta: AttentionMetadata,
                        images: list) -> list[tuple[int, int, torch.Tensor]]:
        """Replace the placeholder rows this step computes with their images' embeddings
        (the encoder output's first `hidden` columns); returns each placed run as (first
        row, end row in `x`, its encoder output rows)."""
        offsets, placed = _patch_offsets, []
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
                rows = emb[lo - start: hi - start].to(x.dtype)
                x[s + lo - k: s + hi - k] = rows[:, :x.shape[1]]
                placed.append((s + lo - k, s + hi - k, rows))
        return placed

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
