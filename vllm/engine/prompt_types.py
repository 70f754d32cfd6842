"""The prompt types between the fronts and the engine (a tokenized prompt, a text the engine
loop tokenizes), and the small checks and cuts on them that do not need a tokenizer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


class InvalidTextError(ValueError):
    """A text that is not valid Unicode (a lone UTF-16 surrogate): no tokenizer can encode
    it, and Hugging Face's raises a TypeError deep inside instead of saying so."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def check_text(text: str, field: str = "input") -> str:
    """`text` unchanged, or InvalidTextError naming `field` when it holds a lone surrogate
    (JSON's "\\ud800" or the raw bytes ED A0 80 both decode to one)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = ord(text[exc.start])
        raise InvalidTextError(
            f"`{field}` is not valid Unicode text: it holds a lone UTF-16 surrogate "
            f"(U+{char:04X} at character {exc.start}); send text encoded as UTF-8.",
            field) from None
    return text


@dataclass(frozen=True)
class TokenizedPrompt:
    """A prompt ready for the engine. Immutable: a step that changes one (padding, a cache
    salt, a sentence-transformers prompt length) makes a new one (`dataclasses.replace`)."""

    prompt_token_ids: list[int]
    token_type_ids: Optional[list[int]] = None
    cache_salt: Optional[str] = None   # separates prefix-cache entries (e.g. per tenant)
    prompt_len: Optional[int] = None   # leading tokens that are a sentence-transformers prompt
    task_adapter: Optional[str] = None  # the task LoRA its prompt name chose (jina v3)
    # An image prompt's pixels (vllm.multimodal.inputs.ImageInputs); its ids are placeholders
    images: Any = None

    @property
    def mm_key(self) -> Optional[tuple[str, ...]]:
        """The content hashes of the prompt's images (None: a text prompt)."""
        return None if self.images is None else tuple(self.images.hashes)


@dataclass
class TextPrompt:
    """A plain string the server hands to the engine untokenized: the engine loop
    tokenizes every text that arrived for a step in one batch (see AsyncLLM)."""
    text: str
    truncate_prompt_tokens: Optional[int] = None
    truncation_side: Optional[str] = None
    prompt_len: Optional[int] = None
    cache_salt: Optional[str] = None
    task_adapter: Optional[str] = None


TRUNCATION_SIDES = ("left", "right")


def cut_ids(seq: list, k: int, side: str) -> list:
    """`seq` cut to `k` items at `side`: "left" keeps the last k, "right" the first k."""
    return seq[-k:] if side == "left" else seq[:k]


class TokenCap(int):
    """A truncation length that is a per-text cap (max_tokens_per_query / max_tokens_per_doc
    on an embedding model, special tokens not counted): always the tokenizer's own cut,
    which keeps the special tokens, whatever the side."""
