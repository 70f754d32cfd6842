"""Upstream's chat-style multimodal inputs as engine prompts.

`messages` (on /v1/embeddings and /pooling) and a score/rerank item `{"content": [parts]}`
hold content parts: `{"type": "text", "text": ...}` and `{"type": "image_url",
"image_url": {"url": ...}}` (a message's content may also be a plain string). A dual
encoder embeds one prompt of text only or of one image only. Images are counted against
--limit-mm-per-prompt before any is fetched or decoded; each URL is checked and decoded by
the server's `MediaPolicy` (vllm/multimodal/media.py). Every refusal is a ValueError (a 400)
whose `field` names the request field.
"""
from __future__ import annotations

from typing import Any, Union

from vllm.multimodal.image import MediaError
from vllm.multimodal.media import MediaPolicy

Prompt = Union[str, dict]


def _parts(content: Any, field: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise MediaError("content must be a string or a list of content parts.", field)
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in ("text", "image_url"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise MediaError(f"Unsupported content part {kind!r}: use 'text' or 'image_url'.",
                             field)
    return content


def message_parts(messages: Any, field: str = "messages") -> list[dict]:
    """Every content part of `messages`, in order."""
    if not isinstance(messages, list) or not messages:
        raise MediaError("messages must be a non-empty list of {role, content} objects.", field)
    parts: list[dict] = []
    for message in messages:
        if not isinstance(message, dict) or "content" not in message:
            raise MediaError("Each message needs a `content`.", field)
        parts += _parts(message["content"], field)
    return parts


def _url(part: dict, field: str) -> str:
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        raise MediaError("An image_url part needs {\"image_url\": {\"url\": ...}}.", field)
    return url


def parts_prompt(parts: list[dict], policy: MediaPolicy, limit: int,
                 field: str = "messages", with_text: bool = False) -> Prompt:
    """The engine prompt of `parts`: their text (parts joined by newlines), or
    `{"prompt": "", "multi_modal_data": {"image": ...}}` for image parts. `with_text` (a
    vision-language model's score item): images and text together, the text parts joined
    with no separator as upstream joins them (the engine puts the images in front)."""
    urls = [_url(p, field) for p in parts if p["type"] == "image_url"]
    texts = [p.get("text") for p in parts if p["type"] == "text"]
    if not all(isinstance(t, str) for t in texts):
        raise MediaError("A text part needs {\"text\": \"...\"}.", field)
    if not urls:
        return "\n".join(texts)
    if len(urls) > limit:
        raise MediaError(f"At most {limit} image(s) may be provided in one prompt "
                         f"(--limit-mm-per-prompt); got {len(urls)}.", field)
    if any(t.strip() for t in texts) and not with_text:
        raise MediaError("This model takes text-only or image-only inputs, not both: send "
                         "the image and the text as separate inputs.", field)
    images = [policy.load_image(u, field) for u in urls]
    return {"prompt": "".join(texts) if with_text else "",
            "multi_modal_data": {"image": images[0] if len(images) == 1 else images}}


def chat_prompt(messages: Any, tokenizer: Any, policy: MediaPolicy, limit: int,
                add_generation_prompt: bool = False, field: str = "messages") -> Prompt:
    """A vision-language model's `messages` through its tokenizer's chat template (image
    parts rendered as the template's image placeholder), with the images in order."""
    parts = message_parts(messages, field)
    urls = [_url(p, field) for p in parts if p["type"] == "image_url"]
    if len(urls) > limit:
        raise MediaError(f"At most {limit} image(s) may be provided in one prompt "
                         f"(--limit-mm-per-prompt); got {len(urls)}.", field)
    if not getattr(tokenizer, "chat_template", None):
        raise MediaError("The model's tokenizer has no chat template to render `messages`; "
                         "send `input` instead.", field)
    conversation = [{"role": m.get("role", "user"), "content": m["content"] if isinstance(
        m["content"], str) else [{"type": "image"} if p["type"] == "image_url" else p
                                 for p in _parts(m["content"], field)]} for m in messages]
    text = tokenizer.apply_chat_template(conversation, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
    if not urls:
        return text
    return {"prompt": text, "multi_modal_data": {
        "image": [policy.load_image(u, field) for u in urls]}}


def item_prompt(item: Any, policy: MediaPolicy, limit: int, field: str,
                with_text: bool = False) -> Prompt:
    """A score/rerank item: a string, or `{"content": [parts]}` (`with_text`: see
    `parts_prompt`)."""
    if isinstance(item, str):
        return item
    if not isinstance(item, dict) or "content" not in item:
        raise MediaError("An item must be a string or {\"content\": [parts]}.", field)
    return parts_prompt(_parts(item["content"], field), policy, limit, field, with_text)
