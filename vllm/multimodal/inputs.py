"""An image prompt as the engine carries it: pixel tensors beside placeholder token ids.

A dual encoder (CLIP, SigLIP) embeds a prompt's text or its image, never both. The image
stands in the prompt as one placeholder id per position its vision tower computes (patches,
plus CLIP's class token), so the scheduler's token budget counts real work; the pixels
ride with the request to the model runner (`ImageInputs`), and their content hashes keep
different images apart wherever prompts are compared (deduplication, later the cache).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional

import torch

from vllm.multimodal.image import as_rgb, image_hash
from vllm.multimodal.lru import TensorLRU

# The id every image position carries (the vision tower never reads it).
PLACEHOLDER_ID = 0
_PROCESSED_CACHE_BYTES = 128 * 2**20  # processed images kept per processor


@dataclass
class ImageInputs:
    """A prompt's images: pixel values (dual encoders [n, 3, H, W]; Qwen2-VL its patches,
    [sum of patches, C * T * P * P]) and one content hash per image. A vision-language
    model's prompt also carries each image's patch grid (t, h, w), its placeholder span
    (start, length) in the prompt, and every token's multimodal rotary position [3, L]."""

    pixel_values: torch.Tensor
    hashes: list[str]
    grids: Optional[list[tuple[int, int, int]]] = None
    spans: Optional[list[tuple[int, int]]] = None
    positions: Optional[torch.Tensor] = None

    @property
    def position_keys(self) -> Optional[list[tuple[int, str]]]:
        """(first placeholder, content hash) of each image placed in the prompt's tokens:
        the prefix cache's block hashes cover them (None for a dual encoder's image)."""
        if self.spans is None:
            return None
        return [(start, h) for (start, _), h in zip(self.spans, self.hashes)]


def placeholder_len(hf_config) -> int:
    """Positions the vision tower computes for one image: its patches (+ CLIP's class
    token)."""
    vision = hf_config.vision_config
    patches = (vision.image_size // vision.patch_size) ** 2
    return patches + (1 if hf_config.model_type == "clip" else 0)


def _as_images(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


class ImagePrompts:
    """Builds image prompts for a dual-encoder model (`ModelConfig.is_multimodal`)."""

    def __init__(self, model_config, tokenizer) -> None:
        self.mc = model_config
        self.tokenizer = tokenizer
        self.limit = model_config.mm_limit("image")
        # processed images by content hash: a document image behind many queries (the
        # rerank shape) is resized and normalised once
        self._processed = TensorLRU(_PROCESSED_CACHE_BYTES)

    def process(self, image, key: str) -> tuple[torch.Tensor, Optional[tuple[int, int, int]]]:
        """(pixel values, patch grid or None) of one image, by its content hash `key`."""
        return self._processed.get(key, lambda: self._run_processor(image))

    def _run_processor(self, image) -> tuple[torch.Tensor, Optional[tuple[int, int, int]]]:
        out = self.image_processor(images=[image], return_tensors="pt")
        grid, shape = out.get("image_grid_thw"), out.get("spatial_shapes")
        if shape is not None:  # SigLIP2: the image's own patches, without the padding
            h, w = (int(v) for v in shape[0])
            return out["pixel_values"][0, :h * w], (1, h, w)
        return out["pixel_values"], None if grid is None else tuple(int(v) for v in grid[0])

    @functools.cached_property
    def image_processor(self):
        """The checkpoint's slow image processor (no torchvision needed)."""
        from transformers import AutoImageProcessor
        return AutoImageProcessor.from_pretrained(str(self.mc.path), backend="pil")

    def check_count(self, count: int) -> None:
        """ValueError when a prompt holds more images than --limit-mm-per-prompt allows."""
        if count > self.limit:
            raise ValueError(f"At most {self.limit} image(s) may be provided in one prompt "
                             f"(--limit-mm-per-prompt); got {count}.")

    def build(self, prompt: dict, text_ids: Optional[list[int]]) -> "tuple[list[int], ImageInputs]":
        """(placeholder ids, image inputs) of a prompt dict with `multi_modal_data`;
        `text_ids`: the prompt's own tokens (special tokens only, or none, are allowed)."""
        data = prompt["multi_modal_data"]
        if not isinstance(data, dict) or set(data) - {"image"}:
            raise ValueError(f"multi_modal_data must be {{'image': ...}}; "
                             f"{self.mc.architecture} takes images only.")
        images = [as_rgb(img) for img in _as_images(data.get("image", []))]
        if not images:
            raise ValueError("multi_modal_data holds no image.")
        self.check_count(len(images))
        hashes = [image_hash(img) for img in images]
        processed = [self.process(img, key) for img, key in zip(images, hashes)]
        if self.mc.is_causal:  # a vision-language model: text and images together
            from vllm.multimodal.vlm_inputs import vlm_layout
            grids = [grid for _, grid in processed]
            ids, spans, positions = vlm_layout(self.mc.hf_config, list(text_ids or []), grids)
            return ids, ImageInputs(torch.cat([p for p, _ in processed]), hashes, grids=grids,
                                    spans=spans, positions=positions)
        special = set(self.tokenizer.all_special_ids)
        if text_ids and not all(t in special for t in text_ids):
            raise ValueError(f"{self.mc.architecture} takes text-only or image-only prompts, "
                             "not both: pass the image with an empty prompt (\"prompt\": \"\").")
        pixels = torch.cat([p for p, _ in processed])
        grids = [grid for _, grid in processed]
        count = sum(t * h * w for t, h, w in grids) if grids[0] is not None else \
            placeholder_len(self.mc.hf_config) * len(images)
        return [PLACEHOLDER_ID] * count, ImageInputs(
            pixels, hashes, grids=grids if grids[0] is not None else None)
