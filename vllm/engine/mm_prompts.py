"""Image prompts and scoring templates, mixed into `InputProcessor`: a prompt dict with
`multi_modal_data` becomes placeholder ids plus its images (vllm/multimodal/inputs.py), and a
cross-encoder pair goes through the model's scoring template where it has one."""
from __future__ import annotations

from typing import Any, Optional


class ImagePromptsMixin:
    """Mixed into `InputProcessor`: uses its `mc`, `tokenizer`, `_call`, `tokenize_prompt`
    and `tokenize_pair`."""

    _images: Any = None  # ImagePrompts, built on the first image prompt

    def _image_ids(self, prompt: dict, add_special_tokens: bool) -> tuple[list[int], Any]:
        """(ids, ImageInputs) of a prompt dict with `multi_modal_data`: a dual encoder's
        placeholders for its image (no text), or a vision-language model's text with each
        image's placeholders expanded."""
        if not self.mc.is_multimodal:
            raise ValueError(f"{self.mc.architecture} takes no images; send text prompts.")
        if self._images is None:
            from vllm.multimodal.inputs import ImagePrompts
            self._images = ImagePrompts(self.mc, self.tokenizer)
        text = prompt.get("prompt_token_ids")
        if text is None and prompt.get("prompt"):
            text = self._call(prompt["prompt"], None, None, None,
                              add_special_tokens=add_special_tokens)["input_ids"]
        text = list(text or []) + list(prompt.get("suffix_ids", ()))
        return self._images.build(prompt, text)

    def _template_ids(self, prompt: dict) -> list[int]:
        """A scoring template's prompt, then its score token(s) (`suffix_ids`)."""
        return list(self._call(prompt["prompt"], None, None, None)["input_ids"]) + \
            list(prompt["suffix_ids"])

    def tokenize_score_pair(self, query: Any, document: Any,
                            truncate_prompt_tokens: Optional[int] = None,
                            truncation_side: Optional[str] = None, max_tokens_2: int = 0):
        """A cross-encoder pair: through the model's scoring template where it has one (its
        items texts or image prompts: jina-reranker-m0), else the tokenizer's pair form."""
        from vllm.multimodal.vlm_inputs import SCORE_TEMPLATES, score_prompt
        arch = self.mc.architecture
        if arch in SCORE_TEMPLATES:
            return self.tokenize_prompt(score_prompt(arch, query, document),
                                        truncate_prompt_tokens, truncation_side=truncation_side)
        if not (isinstance(query, str) and isinstance(document, str)):
            raise ValueError(f"{arch} scores text pairs; image items are scored by embedding "
                             "models (CLIP, SigLIP) and template rerankers (jina-reranker-m0).")
        return self.tokenize_pair(query, document, truncate_prompt_tokens, truncation_side,
                                  max_tokens_2)
