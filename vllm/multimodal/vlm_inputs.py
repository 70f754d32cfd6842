"""Image prompts of a vision-language model (Qwen2-VL, Qwen3-VL): each `<|image_pad|>` in the prompt
becomes one placeholder per merged patch of its image, and every token gets its multimodal
rotary position (temporal, height, width): text counts on from the last position, an
image's tokens sit on their grid, and the text after an image starts past the grid's larger
side. The positions and each image's span and content hash travel in `ImageInputs`.

Score items (a text or an image prompt) of vision-language rerankers: a built-in template
(jina-reranker-m0), or a Jinja score template rendered over image markers that become the
placeholders again, the images attached in the order the rendered prompt holds them."""
from __future__ import annotations

from typing import Any, Union

import torch


def expand_pads(ids: list[int], pad_id: int, sizes: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """`ids` with the i-th `pad_id` repeated sizes[i] times, and each image's (start,
    length) in the result; a ValueError when the pads and images do not pair up."""
    pads = [i for i, t in enumerate(ids) if t == pad_id]
    if len(pads) != len(sizes):
        raise ValueError(f"The prompt has {len(pads)} image placeholder(s) (<|image_pad|>) "
                         f"but {len(sizes)} image(s) were given; put one <|image_pad|> per "
                         "image (inside <|vision_start|>...<|vision_end|>).")
    out: list[int] = []
    spans: list[tuple[int, int]] = []
    prev = 0
    for pos, n in zip(pads, sizes):
        out += ids[prev:pos]
        spans.append((len(out), n))
        out += [pad_id] * n
        prev = pos + 1
    return out + ids[prev:], spans


def mrope_positions(length: int, spans: list[tuple[int, int]], grids: list[tuple[int, int, int]],
                    merge: int) -> torch.Tensor:
    """[3, length] positions (t, h, w) of a prompt whose images sit at `spans` with patch
    grids `grids` (t, h, w before merging)."""
    parts: list[torch.Tensor] = []
    pos, cur = 0, 0
    for (start, n), (t, h, w) in zip(spans, grids):
        if start > cur:
            parts.append(torch.arange(start - cur).expand(3, -1) + pos)
            pos += start - cur
        gh, gw = h // merge, w // merge
        grid_t, grid_h, grid_w = torch.meshgrid(torch.arange(t), torch.arange(gh),
                                                torch.arange(gw), indexing="ij")
        parts.append(torch.stack([grid_t, grid_h, grid_w]).reshape(3, -1) + pos)
        pos += max(gh, gw)
        cur = start + n
    if length > cur:
        parts.append(torch.arange(length - cur).expand(3, -1) + pos)
    return torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)


def vlm_layout(hf_config, ids: list[int], grids: list[tuple[int, int, int]]
               ) -> tuple[list[int], list[tuple[int, int]], torch.Tensor]:
    """(expanded ids, each image's placeholder span, M-RoPE positions [3, T]) of a
    Qwen2-VL prompt whose images have these patch grids."""
    merge = hf_config.vision_config.spatial_merge_size
    sizes = [t * h * w // (merge * merge) for t, h, w in grids]
    expanded, spans = expand_pads(ids, hf_config.image_token_id, sizes)
    return expanded, spans, mrope_positions(len(expanded), spans, grids, merge)


IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
# Cross-encoders that score a pair through a prompt template (document first), and the ids
# appended after it (the token the score head reads), as upstream serves them.
SCORE_TEMPLATES = {
    "JinaVLForRanking": ("**Document**:\n{document}\n**Query**:\n{query}", (100,)),
    "JinaVLForSequenceClassification": ("**Document**:\n{document}\n**Query**:\n{query}",
                                        (100,)),
}


def item_images(item: Any) -> tuple[str, list]:
    """A score item's own text and its images: a text, or an image prompt
    ({"prompt": text, "multi_modal_data": {"image": one or a list}})."""
    if isinstance(item, str):
        return item, []
    data = item.get("multi_modal_data") or {}
    images = data.get("image", [])
    images = list(images) if isinstance(images, (list, tuple)) else [images]
    return item.get("prompt") or "", images


def placed_text(text: str, count: int) -> str:
    """`text` holding `count` image placeholders: those it lacks go in front, as upstream
    lays out a content-part list (the images, then the text; Qwen3-VL-Reranker's layout)."""
    missing = count - text.count(IMAGE_PLACEHOLDER)
    if missing < 0:
        raise ValueError(f"A score item's text holds {text.count(IMAGE_PLACEHOLDER)} image "
                         f"placeholder(s) but {count} image(s) were given.")
    return IMAGE_PLACEHOLDER * missing + text


def mark_images(text: str, images: list, tag: str) -> tuple[str, dict[str, Any]]:
    """`text` with each image placeholder replaced by a marker unique to its image (`tag`
    plus its index), and marker -> image. A text without images comes back unchanged."""
    if not images:
        return text, {}
    pieces = placed_text(text, len(images)).split(IMAGE_PLACEHOLDER)
    markers = [f"\x00{tag}:{i}\x00" for i in range(len(images))]
    marked = pieces[0] + "".join(m + piece for m, piece in zip(markers, pieces[1:]))
    return marked, dict(zip(markers, images))


def place_images(rendered: str, marked: dict[str, Any]) -> Union[str, dict]:
    """A rendered score prompt with its image markers back as placeholders: an image prompt
    whose images are in the order the template placed them (a template may put the
    document before the query), or the text when it places no image."""
    if any(rendered.count(marker) > 1 for marker in marked):
        raise ValueError("The score template places an image item's content more than "
                         "once; an image may appear once in the scored prompt.")
    placed = sorted((rendered.index(m), m) for m in marked if m in rendered)
    for _, marker in placed:
        rendered = rendered.replace(marker, IMAGE_PLACEHOLDER)
    if not placed:
        return rendered
    return {"prompt": rendered, "multi_modal_data": {"image": [marked[m] for _, m in placed]}}


def score_prompt(architecture: str, query: Any, document: Any) -> dict:
    """The prompt dict scoring (query, document) on a template cross-encoder; either item is
    a text or an image prompt ({"prompt": "", "multi_modal_data": {"image": ...}})."""
    template, suffix = SCORE_TEMPLATES[architecture]
    (q_text, q_images), (d_text, d_images) = item_images(query), item_images(document)
    prompt = {"prompt": template.format(document=placed_text(d_text, len(d_images)),
                                        query=placed_text(q_text, len(q_images))),
              "suffix_ids": list(suffix)}
    if d_images or q_images:
        prompt["multi_modal_data"] = {"image": d_images + q_images}
    return prompt
