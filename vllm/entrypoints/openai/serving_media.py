"""Chat-style and multimodal request items as engine prompts, for the serving modules.

Images are fetched and decoded on the tokenizer thread (the event loop stays free); every
refusal (a model that takes no images, a URL the media policy refuses, bytes that are not
an allowed image, too many images) is a 400 naming the field.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from vllm.entrypoints.chat_inputs import (Prompt, chat_prompt, item_prompt, message_parts,
                                          parts_prompt)
from vllm.entrypoints.openai.errors import bad_request


async def _on_tokenizer_thread(ctx: Any, work: Callable[..., Any], field: str) -> Any:
    try:
        return await ctx.engine.run_in_tokenizer_thread(work)
    except ValueError as exc:
        raise bad_request(str(exc), getattr(exc, "field", field)) from exc


def _media(ctx: Any) -> tuple[Any, int]:
    mc = ctx.model_config
    return mc.media_policy, mc.mm_limit("image")


async def message_prompts(ctx: Any, messages: list[Any],
                          add_generation_prompt: bool = False) -> list[Prompt]:
    """`messages` as one engine prompt (multimodal models; text models need `input`): a
    vision-language model renders them with its chat template, a dual encoder takes text
    parts or one image."""
    mc = ctx.model_config
    if not mc.is_multimodal:
        raise bad_request(f"`messages` is served for multimodal models (CLIP, SigLIP, "
                          f"Qwen2-VL); "
                          f"{mc.architecture} applies no chat template here: send `input`.",
                          "messages")
    policy, limit = _media(ctx)
    if mc.is_causal:
        tokenizer = ctx.engine.processor.tokenizer
        return [await _on_tokenizer_thread(ctx, lambda: chat_prompt(
            messages, tokenizer, policy, limit, add_generation_prompt), "messages")]
    prompt = await _on_tokenizer_thread(
        ctx, lambda: parts_prompt(message_parts(messages), policy, limit), "messages")
    return [prompt]


async def item_prompts(ctx: Any, items: Sequence[Any], field: str) -> list[Prompt]:
    """Score/rerank items (strings, or `{"content": [parts]}` on multimodal models; a
    vision-language model's item may hold text and images together)."""
    if all(isinstance(i, str) for i in items):
        return list(items)
    mc = ctx.model_config
    if not mc.is_multimodal:
        raise bad_request(f"{mc.architecture} scores texts only: send strings.", field)
    if mc.is_cross_encoder and not mc.is_causal:
        raise bad_request("Multimodal items are scored by embedding models and "
                          "vision-language rerankers only.", field)
    policy, limit = _media(ctx)
    text_too = mc.is_causal and mc.is_cross_encoder  # a VLM reranker's item
    return await _on_tokenizer_thread(
        ctx, lambda: [item_prompt(i, policy, limit, field, with_text=text_too)
                      for i in items], field)
