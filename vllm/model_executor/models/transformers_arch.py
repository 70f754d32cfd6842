"""Which implementation serves an architecture: the engine's own or the Transformers backend.

`model_impl` (upstream's `--model-impl`): `auto` takes the native class where the
architecture table resolves it, else the Transformers backend when `transformers` has the
class, or the checkpoint ships it as its own code (`auto_map`, run only with
`trust_remote_code=True`: `transformers_remote.py`); `vllm` only the native one;
`transformers` always the backend. The backend's
facts are decided here, at config time, from the `transformers` classes alone (no weights):
causal or bidirectional, and whether its attention can be routed through the engine's.

No torch import at module level: transformers' classes are imported only when an
architecture actually needs the backend.
"""
from __future__ import annotations

import inspect
from typing import Any, Optional

from vllm.model_executor.models.registry import (ModelEntry, ResolvedArch, config_variant,
                                                 resolve_architecture)
from vllm.model_executor.models.transformers_refusals import (has_transformers_class, no_class,
                                                              remote_without_base,
                                                              structural_refusal, unknown_suffix,
                                                              untrusted_remote_code)
from vllm.model_executor.models.transformers_remote import RemoteCode

MODEL_IMPLS = ("auto", "vllm", "transformers")
BACKEND_MODULE, BACKEND_CLASS = "transformers_backend", "TransformersModel"

# Task suffixes the backend serves: (convert, pooling) on a causal LM, whose head is the
# engine's `score`; an encoder keeps its task class's own head, pooled CLS (tokens: ALL).
_TASK_HEADS = {"ForSequenceClassification": ("classify", "LAST"),
               "ForTokenClassification": ("classify", "ALL")}
# Suffixes whose checkpoint holds a base model the backend serves for embeddings (a
# `*ForConditionalGeneration` only where its text-only use is verified: TEXT_ONLY_VERIFIED).
_EMBED_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "Model",
                   "ForConditionalGeneration")
# Model-type mappings whose classes are decoders (text, or text with images).
_DECODER_MAPPINGS = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
                     "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES")


def resolve_model_impl(arch_name: str, model_impl: str, hf_config: Any,
                       remote: Optional[RemoteCode] = None) -> tuple[ResolvedArch, str, str]:
    """(resolved architecture, "vllm" | "transformers", why) for `model_impl`; `remote`:
    the checkpoint's own classes (config.json's auto_map), if it ships any."""
    if model_impl not in MODEL_IMPLS:
        raise ValueError(f"model_impl={model_impl!r} is not supported; use one of "
                         f"{', '.join(MODEL_IMPLS)}.")
    try:
        native: Optional[ResolvedArch] = resolve_architecture(arch_name, hf_config)
        native_error = ""
    except ValueError as exc:
        native, native_error = None, str(exc)
    if model_impl == "vllm":
        if native is None:
            raise ValueError(
                f"{arch_name} has no native implementation in this engine, and "
                f"model_impl='vllm' asks for one. Pass --model-impl transformers "
                f"(LLM(model_impl='transformers')) or leave model_impl 'auto' to run it on "
                f"the Transformers backend.")
        return native, "vllm", "model_impl='vllm'"
    if model_impl == "auto" and native is not None:
        unused = "; the checkpoint's own code (auto_map) is not run" if remote else ""
        return native, "vllm", "the engine implements it natively" + unused
    if config_variant(arch_name, hf_config) is not None:
        raise ValueError(f"This {arch_name} checkpoint has a layout transformers' class does "
                         f"not implement (its code is remote: {native.base.class_name}); "
                         "use model_impl='auto' or 'vllm'.")
    if native is not None and native.base.multimodal:
        raise ValueError(f"{arch_name} takes images; the Transformers backend serves text "
                         "models only. Use model_impl='auto' or 'vllm'.")
    arch = backend_architecture(arch_name, hf_config, native_error, remote)
    why = "model_impl='transformers'" if model_impl == "transformers" else \
        "the engine has no native implementation and transformers implements the class"
    if serves_remote(arch_name, remote):
        why = ("model_impl='transformers'" if model_impl == "transformers" else
               "neither the engine nor transformers has the class") + \
            f"; the checkpoint's own code {remote.class_ref(arch_name)} (trust_remote_code=True)"
    return arch, "transformers", why


def serves_remote(arch_name: str, remote: Optional[RemoteCode]) -> bool:
    """Whether the backend would run the checkpoint's own class for `arch_name`: transformers
    lacks it and the checkpoint's auto_map names it."""
    return remote is not None and not has_transformers_class(arch_name) and \
        remote.class_ref(arch_name) is not None


def backend_architecture(arch_name: str, hf_config: Any, native_error: str = "",
                         remote: Optional[RemoteCode] = None) -> ResolvedArch:
    """The Transformers backend's ResolvedArch for `arch_name`; an ArchitectureRefused
    (a ValueError whose `kind` names the rule) where it cannot serve it."""
    own_code = serves_remote(arch_name, remote)
    if own_code and not remote.trusted:
        raise untrusted_remote_code(arch_name, remote.class_ref(arch_name))
    if own_code and remote.base_ref is None:
        raise remote_without_base(arch_name)
    if not own_code and not has_transformers_class(arch_name) and \
            not causal_classifier_of_family(arch_name, hf_config):
        raise no_class(arch_name, native_error)
    structural_refusal(arch_name, hf_config)
    causal = remote.is_causal(hf_config) if own_code else is_causal_family(hf_config)
    for suffix, (convert, pooling) in _TASK_HEADS.items():
        if arch_name.endswith(suffix):
            if not causal:  # the task class's own head reads the first token
                pooling = "CLS" if pooling == "LAST" else pooling
            return ResolvedArch(arch_name, _entry(causal, convert, pooling), convert, pooling,
                                convert)
    if not arch_name.endswith(_EMBED_SUFFIXES):
        raise unknown_suffix(arch_name, (*_TASK_HEADS, *_EMBED_SUFFIXES))
    pooling = "LAST" if causal else "CLS"
    return ResolvedArch(arch_name, _entry(causal, "embed", pooling), None, pooling, "embed")


def causal_classifier_of_family(arch_name: str, hf_config: Any) -> bool:
    """A `*ForSequenceClassification` transformers has no class for (GraniteForSequence-
    Classification) on a causal family it has: served as that family's base model with the
    engine's `score` head on the last token, as upstream's as_seq_cls_model does."""
    return arch_name.endswith("ForSequenceClassification") and hf_config is not None and \
        is_causal_family(hf_config)


def convert_backend_architecture(arch: ResolvedArch, convert: str) -> ResolvedArch:
    """`convert` on a backend architecture: a causal base takes any task head (as native
    causal models do); an encoder task class may be served as its bare encoder (embed); an
    encoder without a task class has no head to convert to."""
    if convert == arch.native_convert:
        return arch
    if arch.base.is_causal:
        pooling = {"embed": "LAST", "classify": "LAST", "reward": "ALL"}[convert]
        return ResolvedArch(arch.architecture, _entry(True, convert),
                            None if convert == "embed" else convert, pooling, convert)
    if convert == "embed":
        return ResolvedArch(arch.architecture, _entry(False, "embed", "CLS"), None, "CLS",
                            "embed")
    raise ValueError(f"{arch.architecture} is an encoder served by the Transformers backend "
                     f"and has no {convert!r} head; serve a checkpoint whose architecture is "
                     f"its *ForSequenceClassification class, or convert='embed'.")


def encoder_task_class(architecture: str, convert: str, causal: bool,
                       remote: Optional[RemoteCode] = None):
    """The transformers task class (or the checkpoint's own, `remote`) whose own head
    serves an encoder classifier (None for embeddings and for causal heads, which take
    the engine's `score` head)."""
    if causal or convert != "classify" or not architecture.endswith(tuple(_TASK_HEADS)):
        return None
    if remote is not None:
        return remote.load_class(remote.class_ref(architecture))
    import transformers
    return getattr(transformers, architecture)


def _entry(causal: bool, convert: str, pooling: str = "LAST") -> ModelEntry:
    return ModelEntry(BACKEND_MODULE, BACKEND_CLASS, pooling, convert, causal)


def is_causal_family(hf_config: Any) -> bool:
    """A decoder family: transformers has a causal LM (or an image-text-to-text decoder)
    for its model type and no masked LM (BERT-like encoders also have a `*ForCausalLM`;
    decoders have no masked LM), and the model is not an encoder-decoder."""
    from transformers.models.auto import modeling_auto
    model_type = hf_config.model_type
    decoder = any(model_type in getattr(modeling_auto, name) for name in _DECODER_MAPPINGS)
    return decoder and model_type not in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES \
        and not getattr(hf_config, "is_encoder_decoder", False)


def base_model_class(hf_config: Any, remote: Optional[RemoteCode] = None):
    """The transformers class of the bare backbone: the architecture itself when it is a
    base `*Model` (DistilBertModel, T5EncoderModel), else AutoModel's class for the type;
    with `remote`, the checkpoint's own AutoModel class."""
    if remote is not None:
        return remote.load_class(remote.base_ref)
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    arch = hf_config.architectures[0]
    if arch.endswith("Model") and not arch.endswith("LMHeadModel") and \
            getattr(transformers, arch, None) is not None:
        return getattr(transformers, arch)
    name = MODEL_MAPPING_NAMES.get(hf_config.model_type)
    if isinstance(name, (tuple, list)):
        name = name[0]
    cls = getattr(transformers, name, None) if name else None
    if cls is None:
        raise ValueError(f"transformers has no base model class for model type "
                         f"{hf_config.model_type!r} ({arch}).")
    return cls


def routing_refusal(hf_config: Any, remote: Optional[RemoteCode] = None) -> Optional[str]:
    """Why the backbone's attention cannot be routed through the engine's (None: it can).
    The load-time probe checks the rest (that the function is really called)."""
    cls = base_model_class(hf_config, remote)
    if not getattr(cls, "_supports_attention_backend", False):
        return f"{cls.__name__} does not take an external attention function"
    if "position_ids" not in inspect.signature(cls.forward).parameters:
        return f"{cls.__name__}.forward takes no position_ids, so packed requests would " \
            "share positions"
    return None
