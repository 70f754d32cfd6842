"""Upstream's `padding` (a pooling request's field; offline, `tokenization_kwargs=
{"padding": ...}`): "max_length" appends the tokenizer's pad token to each prompt, after
truncation, up to max_model_len; "do_not_pad" (or None) leaves prompts as they are.

The pad tokens are ordinary tokens of the prompt: the model attends to them (there is no
attention mask) and they count in `usage`. That is what a model trained on fixed-length,
unmasked text needs (SigLIP: 64 tokens); on a model trained with a mask the embedding
changes, as upstream's does. A prompt with images is refused rather than left unpadded."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

PADDINGS = ("max_length", "do_not_pad")


class PaddingError(ValueError):
    """A padding the engine cannot apply (the 400's `param` is `padding`)."""

    field = "padding"


def check_padding(padding: Any) -> Optional[str]:
    """`padding` if it is one of upstream's values (or None), else a PaddingError."""
    if padding is None or padding in PADDINGS:
        return padding
    raise PaddingError(f"padding must be one of {', '.join(map(repr, PADDINGS))} (or None); "
                       f"got {padding!r}.")


def padding_kwarg(tokenization_kwargs: Optional[dict]) -> Optional[str]:
    """The `padding` of offline `tokenization_kwargs`; any other key is a ValueError (this
    engine takes only `padding` there, and never drops an argument silently)."""
    kwargs = dict(tokenization_kwargs or {})
    padding = check_padding(kwargs.pop("padding", None))
    if kwargs:
        raise ValueError(f"tokenization_kwargs: only 'padding' is supported; got "
                         f"{', '.join(sorted(kwargs))}.")
    return padding


def pad_prompts(prompts: list, padding: Optional[str], tokenizer: Any,
                max_len: int) -> list:
    """`prompts` (TokenizedPrompts) padded to `max_len` when `padding` is "max_length"
    (new prompts; the list as it is otherwise); token type ids are padded with 0."""
    if check_padding(padding) != "max_length":
        return prompts
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        raise PaddingError("padding='max_length' needs a pad token, and this model's "
                           "tokenizer has none.")
    out = []
    for p in prompts:
        if getattr(p, "images", None) is not None:
            raise PaddingError("padding='max_length' applies to text prompts; this prompt "
                               "has an image.")
        n = max_len - len(p.prompt_token_ids)
        if n > 0:
            types = None if p.token_type_ids is None else list(p.token_type_ids) + [0] * n
            p = dataclasses.replace(p, prompt_token_ids=list(p.prompt_token_ids) + [pad] * n,
                                    token_type_ids=types)
        out.append(p)
    return out
