"""Why the Transformers backend cannot serve an architecture, decided from names and the
config alone (no weights, no torch import at module level).

Every refusal is an `ArchitectureRefused` (a ValueError) whose `kind` says which rule
refused it, so a user reads the reason and tests can count the reasons:

- `no-class`: neither the engine nor `transformers` has the class, and the checkpoint's
  config.json names no class of that name in its `auto_map` (with one, the backend runs
  the checkpoint's own class under `trust_remote_code=True`: `transformers_remote.py`);
  or the name is one upstream vLLM gives its own implementation.
- `remote-code`: the class is the checkpoint's own code (`auto_map`) and the user did not
  pass `trust_remote_code=True`, or its auto_map names no base model (`AutoModel`).
- `bidirectional-variant`: upstream's name for a bidirectional (embedding) variant of a
  decoder family (`LlamaBidirectionalModel`, ...): the checkpoint is served as its family's
  class with `is_causal: false` and its pooling named by the user.
- `encoder-decoder`: a sequence-to-sequence model (Whisper, T5, BART generation
  classes): the engine serves one stack of layers over the prompt.
- `multimodal`: a `*ForConditionalGeneration` that takes images, audio or video, whose
  text-only use has not been verified equal to transformers here.
- `no-pooling-class`: transformers has the class, but its suffix names a task head the
  backend has no rule for (retrieval heads, question answering, ...).
"""
from __future__ import annotations

import functools
from typing import Any

# Multimodal generation classes whose language model, fed text alone, equals
# transformers' base model on the same ids (tests/test_upstream_conversions.py).
TEXT_ONLY_VERIFIED = frozenset({"Gemma3ForConditionalGeneration",
                                "Qwen2_5_VLForConditionalGeneration"})


class ArchitectureRefused(ValueError):
    """An architecture no implementation here can serve; `kind` names the rule."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@functools.lru_cache(maxsize=1)
def _transformers_names() -> frozenset[str]:
    import transformers  # its lazy module lists every class without importing it
    return frozenset(dir(transformers))


def has_transformers_class(name: str) -> bool:
    """Whether `transformers` exports a class of that name (no modeling import)."""
    return name in _transformers_names()


def no_class(arch_name: str, native_error: str = "") -> ArchitectureRefused:
    import transformers
    family = arch_name.split("Bidirectional", 1)[0] if "Bidirectional" in arch_name else None
    if family and has_transformers_class(f"{family}Model"):
        return ArchitectureRefused("bidirectional-variant", (
            f"{arch_name} is upstream's bidirectional variant of {family}, which has no "
            f"class of its own here. Serve the checkpoint as {family}Model with "
            f"hf_overrides={{'architectures': ['{family}Model'], 'is_causal': False}} and "
            f"override_pooler_config={{'pooling_type': ...}} set from its config's "
            f"`pooling` field (avg: MEAN, cls: CLS, last: LAST)."))
    head, _, supported = native_error.partition(" Supported architectures:")
    lead = head.rstrip(".") + ", and " if native_error else ""
    tail = f" Natively supported architectures:{supported}" if supported else ""
    return ArchitectureRefused("no-class", (
        f"{lead}transformers {transformers.__version__} has no class {arch_name} either, so "
        f"the Transformers backend cannot serve it: the checkpoint ships no such class "
        f"in its config.json auto_map (with one, trust_remote_code=True runs it), or it is "
        f"an architecture only upstream vLLM's own code implements. If the checkpoint is a "
        f"family transformers has, name that class with "
        f"hf_overrides={{'architectures': [...]}}.{tail}"))


def untrusted_remote_code(arch_name: str, ref: str) -> ArchitectureRefused:
    return ArchitectureRefused("remote-code", (
        f"{arch_name} is not a class of this engine or of transformers; the checkpoint ships "
        f"it as its own code (config.json auto_map: {ref}), which runs only if you trust it. "
        f"Pass trust_remote_code=True (LLM(..., trust_remote_code=True); vllm serve "
        f"--trust-remote-code) to serve it on the Transformers backend."))


def remote_without_base(arch_name: str) -> ArchitectureRefused:
    return ArchitectureRefused("remote-code", (
        f"{arch_name} is the checkpoint's own code, but its config.json auto_map names no "
        f"AutoModel class: the Transformers backend runs the base model (and a task class's "
        f"head over it), so it cannot serve this checkpoint."))


def structural_refusal(arch_name: str, hf_config: Any) -> None:
    """Raise for a transformers class the backend cannot serve as a pooling model."""
    if getattr(hf_config, "is_encoder_decoder", False):
        raise ArchitectureRefused("encoder-decoder", (
            f"{arch_name} is an encoder-decoder (sequence-to-sequence) model; the engine "
            f"serves decoder-only and encoder-only stacks. Serve its encoder alone (e.g. "
            f"T5EncoderModel) where transformers has one."))
    if arch_name.endswith("ForConditionalGeneration") and \
            arch_name not in TEXT_ONLY_VERIFIED:
        raise ArchitectureRefused("multimodal", (
            f"{arch_name} takes images, audio or video, and serving it on text alone is not "
            f"verified here (its language model may attend differently to a prefix, or need "
            f"its media inputs); the Transformers backend serves text-only models and, as "
            f"text embedders/classifiers, {', '.join(sorted(TEXT_ONLY_VERIFIED))}. If the "
            f"checkpoint's language model is a causal LM transformers has, serve that "
            f"class with hf_overrides={{'architectures': [...]}}."))


def unknown_suffix(arch_name: str, suffixes: tuple[str, ...]) -> ArchitectureRefused:
    return ArchitectureRefused("no-pooling-class", (
        f"{arch_name} is a transformers class whose task head the Transformers backend "
        f"has no pooling rule for (it serves the suffixes {', '.join(suffixes)})."))
