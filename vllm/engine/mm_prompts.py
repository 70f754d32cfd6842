"""Image prompts and scoring templates, mixed into `InputProcessor`: a prompt dict with
`multi_modal_data` becomes placeholder ids plus its images (vllm/multimodal/inputs.py), and a
cross-encoder pair goes through the model's scoring template where it has one, or through a
Jinja score template (vllm/transformers_utils/score_template.py) for LLM rerankers. A
vision-language reranker's (Qwen3-VL) image items are rendered through the same template:
each image as a marker, then the model's image placeholder, the images attached in the
order the rendered prompt holds them."""
from __future__ import annotations

import uuid
from typing import Any, Callable, Optional

from vllm.logger import init_logger

logger = init_logger(__name__)


class ImagePromptsMixin:
    """Mixed into `InputProcessor`: uses its `mc`, `tokenizer`, `_call`, `tokenize_prompt`
    and `tokenize_pair`."""

    _images: Any = None  # ImagePrompts, built on the first image prompt
    _st_template: Any = False  # a CrossEncoder's (template, kwargs) or None; False: unread
    _warned_untemplated = False

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
                            truncation_side: Optional[str] = None, max_tokens_2: int = 0,
                            chat_template: Optional[str] = None,
                            chat_template_kwargs: Optional[dict[str, Any]] = None):
        """A cross-encoder pair: through the model's scoring template where it has one (its
        items texts or image prompts: jina-reranker-m0), else through a score template (the
        call's `chat_template` text, --chat-template, or the one a sentence-transformers
        CrossEncoder declares), else, for an LLM reranker (`classifier_from_token`), the two
        items joined as one prompt, else the tokenizer's pair form. Image items need a
        vision-language model (Qwen3-VL-Reranker: a template or the joined form)."""
        from vllm.multimodal.vlm_inputs import SCORE_TEMPLATES, score_prompt
        arch = self.mc.architecture
        if arch in SCORE_TEMPLATES:
            if chat_template is not None or chat_template_kwargs or \
                    self.mc.score_template is not None:
                raise ValueError(f"{arch} scores through its own built-in template; drop "
                                 "chat_template / chat_template_kwargs / instruction.")
            return self.tokenize_prompt(score_prompt(arch, query, document),
                                        truncate_prompt_tokens, truncation_side=truncation_side)
        images = not (isinstance(query, str) and isinstance(document, str))
        if images and not (self.mc.is_multimodal and self.mc.is_causal):
            raise ValueError(f"{arch} scores text pairs; image items are scored by embedding "
                             "models (CLIP, SigLIP) and vision-language rerankers "
                             "(jina-reranker-m0, Qwen3-VL).")
        cut = (truncate_prompt_tokens, truncation_side, max_tokens_2)
        template = self.score_template(chat_template)
        if template is not None:
            from vllm.transformers_utils.score_template import render_score_prompt
            kwargs = {**template[1], **(chat_template_kwargs or {})}
            return self._rendered_pair(query, document, lambda q, d: render_score_prompt(
                self.tokenizer, template[0], q, d, kwargs), *cut)
        if chat_template_kwargs:
            raise ValueError("chat_template_kwargs needs a score template: start the engine "
                             "with --chat-template (or pass chat_template).")
        if getattr(self.mc.hf_config, "classifier_from_token", None):
            self._warn_untemplated_llm_reranker()
            return self._rendered_pair(query, document, lambda q, d: q + d, *cut)
        if images:
            raise ValueError(f"{arch} scores image items through a score template: start "
                             "the engine with --chat-template (or pass chat_template).")
        return self.tokenize_pair(query, document, *cut)

    def score_template(self, chat_template: Optional[str] = None
                       ) -> Optional[tuple[str, dict[str, Any]]]:
        """(template text, its keyword arguments) that scores a text pair, first match: the
        call's own, the engine's --chat-template, a CrossEncoder's declared template."""
        if chat_template is not None:
            return chat_template, {}
        if self.mc.score_template is not None:
            return self.mc.score_template, {}
        if self._st_template is False:  # read once, on the first pair
            from vllm.transformers_utils.score_template import st_cross_encoder_template
            self._st_template = st_cross_encoder_template(self.mc.path, self.tokenizer)
            if self._st_template is not None:
                logger.info("Scoring pairs through the chat template that the "
                            "sentence-transformers CrossEncoder config declares.")
        return self._st_template

    def _rendered_pair(self, query: Any, document: Any, render: Callable[[str, str], str],
                       truncate_prompt_tokens: Optional[int], truncation_side: Optional[str],
                       max_tokens_2: int):
        """The pair's prompt as `render` (a score template, or the two joined) lays it out;
        `max_tokens_2` cuts the document's own text first. An image item's images enter the
        rendering as markers, so that each lands in the prompt as the model's image
        placeholder with the images attached in the order the template placed them."""
        from vllm.multimodal.vlm_inputs import mark_images, place_images
        nonce = uuid.uuid4().hex
        marked: dict[str, Any] = {}
        sides = []
        for name, item, cap in (("query", query, 0), ("document", document, max_tokens_2)):
            text, images = self._item_text(item, name, cap, truncation_side)
            text, marks = mark_images(text, images, f"{nonce}:{name}")
            sides.append(text)
            marked.update(marks)
        prompt = place_images(render(*sides), marked)
        return self.tokenize_prompt(prompt, truncate_prompt_tokens,
                                    truncation_side=truncation_side)

    def _item_text(self, item: Any, field: str, cap: int,
                   side: Optional[str]) -> tuple[str, list]:
        """A score item's own text (cut to `cap` tokens, checked) and its images."""
        from vllm.multimodal.vlm_inputs import item_images
        text, images = item_images(self.cap_item(item, cap, side))
        return self._text(text, field), images

    def cap_item(self, item: Any, cap: int, side: Optional[str] = None) -> Any:
        """A score item with its own text cut to `cap` tokens (`cap_text`); an image
        prompt keeps its images."""
        if not cap:
            return item
        if isinstance(item, str):
            return self.cap_text(item, cap, side)
        return {**item, "prompt": self.cap_text(item.get("prompt") or "", cap, side)}

    def _warn_untemplated_llm_reranker(self) -> None:
        """An LLM reranker (a head from lm_head token rows) was trained on a prompt
        template; scoring the bare pair works but ranks worse. Said once per process."""
        if ImagePromptsMixin._warned_untemplated:
            return
        ImagePromptsMixin._warned_untemplated = True
        logger.warning("%s scores each (query, document) as the two texts joined: this LLM "
                       "reranker was trained on a prompt template, so pass one with "
                       "--chat-template (LLM(chat_template=...)) for its documented scores.",
                       self.mc.architecture)
