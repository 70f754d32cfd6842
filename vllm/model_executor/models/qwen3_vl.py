"""Qwen3-VL as a pooling model (Qwen3-VL-Embedding: LAST pooling; Qwen3-VL-Reranker: the
classify conversion, a score head from the lm_head rows of "no" and "yes").

What changes from Qwen2-VL (qwen2_vl.py keeps the frame: placeholders, the encoder cache
by content hash, prefix caching and chunked prefill):

- the vision tower (`qwen_vision.Qwen3VisionTower`): Conv3d with bias, learned positions
  resampled to each image's grid, a gelu-tanh MLP, and deepstack mergers;
- deepstack: the k deepstack features of an image are added to the hidden states of its
  placeholder rows after decoder layers 0 .. k-1. A step adds them to the rows it
  computes, so a chunk of a split image adds its own rows and a cached block already holds
  keys and values computed with them;
- the decoder is Qwen3's (per-head q/k RMSNorm, no QKV bias);
- interleaved multimodal rotary: frequency j reads the height position where j % 3 == 1,
  the width position where j % 3 == 2 (within 3 * its section), else the temporal one.
  Image positions are Qwen2-VL's (t, h, w offset by the text before; text after an image
  goes on from past the grid's larger side), as transformers' `get_rope_index` gives them.
"""
from __future__ import annotations

from typing import Optional

import torch

from vllm.attention.metadata import AttentionMetadata
from vllm.model_executor.models.qwen2_vl import Qwen2VLEmbeddingModel
from vllm.model_executor.models.qwen_vision import Qwen3VisionTower


class Qwen3VLEmbeddingModel(Qwen2VLEmbeddingModel):
    """Qwen3VLForConditionalGeneration served for pooling (see the module docstring)."""

    qkv_bias = False
    qk_norm = True
    vision_tower = Qwen3VisionTower

    def __init__(self, config) -> None:
        super().__init__(config)
        self.deepstack_layers = len(self.visual.deepstack_visual_indexes)
        if self.deepstack_layers > len(self.layers):
            raise ValueError(f"{self.deepstack_layers} deepstack features need as many "
                             f"decoder layers; the model has {len(self.layers)}.")

    @staticmethod
    def mrope_axes(sections: list[int]) -> torch.Tensor:
        """Interleaved: frequencies 1, 4, 7, ... (below 3 * sections[1]) take the height
        position, 2, 5, 8, ... (below 3 * sections[2]) the width one, the rest time."""
        axes = torch.zeros(sum(sections), dtype=torch.long)
        for axis in (1, 2):
            axes[axis:3 * sections[axis]:3] = axis
        return axes

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, token_type_ids: Optional[torch.Tensor] = None,
                images: Optional[list] = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        placed: list[tuple[int, int, torch.Tensor]] = []
        if images is None:
            rotation = self.rotary.rotations(positions)
        else:
            rotation = self._mrope(positions, meta, images)
            placed = self._scatter_images(x, meta, images)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            # the last layer keeps only the output rows, unless a deepstack feature follows it
            rows = meta.output_rows if i == last and not (placed and i < self.deepstack_layers) \
                else None
            x = layer(x, rotation, meta, rows)
            if placed and i < self.deepstack_layers:
                self._add_deepstack(x, placed, i)
                if i == last and meta.output_rows is not None:
                    x = x[meta.output_rows]
        return self.norm(x)

    @staticmethod
    def _add_deepstack(x: torch.Tensor, placed: list[tuple[int, int, torch.Tensor]],
                       layer: int) -> None:
        """Add deepstack feature `layer` to the image rows this step placed (in place)."""
        width = x.shape[1]
        cols = slice(width * (layer + 1), width * (layer + 2))
        for lo, hi, rows in placed:
            x[lo:hi] += rows[:, cols]
