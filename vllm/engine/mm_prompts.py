"""Image prompts and scoring templates, mixed into `InputProcessor`: a prompt dict with
`multi_modal_data` becomes placeholder ids plus its images (vllm/multimodal/inputs.py), and a
cross-encoder pair goes through the model's scoring template where it has one, or through a
Jinja score template (vllm/transformers_utils/score_template.py) for LLM rerankers."""
from __future__ import annotations

from typing import Any, Optional

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
        texts joined as one prompt, else the tokenizer's pair form."""
        from vllm.multimodal.vlm_inputs import SCORE_TEMPLATES, score_prompt
        arch = self.mc.architecture
        if arch in SCORE_TEMPLATES:
            if chat_template is not None or chat_template_kwargs or \
                    self.mc.score_template is not None:
                raise ValueError(f"{arch} scores through its own built-in template; drop "
                                 "chat_template / chat_template_kwargs / instruction.")
            return self.tokenize_prompt(score_prompt(arch, query, document),
                                        truncate_prompt_tokens, truncation_side=truncation_side)
        if not (isinstance(query, str) and isinstance(document, str)):
            raise ValueError(f"{arch} scores text pairs; image items are scored by embedding "
                             "models (CLIP, SigLIP) and template rerankers (jina-reranker-m0).")
        template = self.score_template(chat_template)
        if template is not None:
            kwargs = {**template[1], **(chat_template_kwargs or {})}
            return self._templated_pair(query, document, template[0], kwargs,
                                        truncate_prompt_tokens, truncation_side, max_tokens_2)
        if chat_template_kwargs:
            raise ValueError("chat_template_kwargs needs a score template: start the engine "
                             "with --chat-template (or pass chat_template).")
        if getattr(self.mc.hf_config, "classifier_from_token", None):
            self._warn_untemplated_llm_reranker()
            return self._joined_pair(query, document, truncate_prompt_tokens, truncation_side,
                                     max_tokens_2)
        return self.tokenize_pair(query, document, truncate_prompt_tokens, truncation_side,
                                  max_tokens_2)

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

    def _templated_pair(self, query: str, document: str, template: str,
                        kwargs: dict[str, Any], truncate_prompt_tokens: Optional[int],
                        truncation_side: Optional[str], max_tokens_2: int):
        """The rendered pair's prompt; `max_tokens_2` cuts the document's own tokens first."""
        from vllm.transformers_utils.score_template import render_score_prompt
        if max_tokens_2:
            document = self.cap_text(document, max_tokens_2, truncation_side)
        text = render_score_prompt(self.tokenizer, template, self._text(query, "query"),
                                   self._text(document, "document"), kwargs)
        return self.tokenize_prompt(text, truncate_prompt_tokens,
                                    truncation_side=truncation_side)

    def _joined_pair(self, query: str, document: str, truncate_prompt_tokens: Optional[int],
                     truncation_side: Optional[str], max_tokens_2: int):
        """An LLM reranker's pair without a template: the two texts joined with no separator
        and tokenized as one prompt, as upstream scores an LLM used as a reranker."""
        if max_tokens_2:
            document = self.cap_text(document, max_tokens_2, truncation_side)
        text = self._text(query, "query") + self._text(document, "document")
        return self.tokenize_prompt(text, truncate_prompt_tokens,
                                    truncation_side=truncation_side)

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
