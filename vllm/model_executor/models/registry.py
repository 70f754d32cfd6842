"""Architecture name -> (module, class, default pooling type, convert kind).

This table imports no torch, so the config layer can resolve pooling defaults without
loading model code. `load_model_class` imports the module only when a model is built.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class ModelEntry:
    module: str           # under vllm.model_executor.models
    class_name: str
    default_pooling_type: str  # the class's `default_pooling_type`
    convert: str          # what the class natively does: embed | classify | reward
    is_causal: bool       # causal (decoder) attention?
    multi_vector: bool = False  # one vector per token (ColBERT): token_embed + MaxSim
    extra_tasks: tuple[str, ...] = ()  # pooling tasks beyond its convert's (BGE-M3)
    multimodal: bool = False  # prompts may carry images (dual encoders: CLIP, SigLIP)
    # The checkpoint holds one LoRA per task (jina-embeddings-v3's `lora_adaptations`),
    # chosen per request by its sentence-transformers prompt name.
    task_adapters: bool = False


_DECODERS = {"Qwen2": "qwen2", "Qwen3": "qwen3", "Llama": "llama", "Mistral": "llama"}

_REGISTRY: dict[str, ModelEntry] = {
    "BertModel": ModelEntry("bert", "BertModel", "CLS", "embed", False),
    "BertForSequenceClassification":
        ModelEntry("bert", "BertForSequenceClassification", "CLS", "classify", False),
    "RobertaModel": ModelEntry("roberta", "RobertaModel", "CLS", "embed", False),
    "RobertaForSequenceClassification":
        ModelEntry("roberta", "RobertaForSequenceClassification", "CLS", "classify", False),
    "XLMRobertaModel": ModelEntry("roberta", "RobertaModel", "CLS", "embed", False),
    "XLMRobertaForSequenceClassification":
        ModelEntry("roberta", "RobertaForSequenceClassification", "CLS", "classify", False),
    "ModernBertModel": ModelEntry("modernbert", "ModernBertModel", "CLS", "embed", False),
    "ModernBertForSequenceClassification":
        ModelEntry("modernbert", "ModernBertForSequenceClassification", "CLS", "classify",
                   False),
    # Rotary encoders whose code ships with the checkpoint (nomic-embed-text, GTE "new",
    # snowflake-arctic-embed-m-v2.0 = GteModel); CLS unless sentence-transformers says else.
    "NomicBertModel": ModelEntry("nomic_bert", "NomicBertModel", "CLS", "embed", False),
    "GteModel": ModelEntry("gte", "GteNewModel", "CLS", "embed", False),
    "GteNewModel": ModelEntry("gte", "GteNewModel", "CLS", "embed", False),
    "GteNewForSequenceClassification":
        ModelEntry("gte", "GteNewForSequenceClassification", "CLS", "classify", False),
    "DebertaV2Model": ModelEntry("deberta_v2", "DebertaV2Model", "CLS", "embed", False),
    "DebertaV2ForSequenceClassification":
        ModelEntry("deberta_v2", "DebertaV2ForSequenceClassification", "CLS", "classify",
                   False),
    "BertForTokenClassification":
        ModelEntry("bert", "BertForTokenClassification", "ALL", "classify", False),
    "RobertaForTokenClassification":
        ModelEntry("roberta", "RobertaForTokenClassification", "ALL", "classify", False),
    "XLMRobertaForTokenClassification":
        ModelEntry("roberta", "RobertaForTokenClassification", "ALL", "classify", False),
    "ModernBertForTokenClassification":
        ModelEntry("modernbert", "ModernBertForTokenClassification", "ALL", "classify",
                   False),
    # Masked-LM checkpoints served as embedders, as upstream (BERT's MLM head: token_classify)
    "BertForMaskedLM": ModelEntry("masked_lm", "BertMaskedLMEmbeddingModel", "CLS", "embed",
                                  False, extra_tasks=("token_classify",)),
    "RobertaForMaskedLM":
        ModelEntry("masked_lm", "RobertaMaskedLMEmbeddingModel", "CLS", "embed", False),
    "MPNetModel": ModelEntry("mpnet", "MPNetModel", "CLS", "embed", False),
    "MPNetForSequenceClassification":
        ModelEntry("mpnet", "MPNetForSequenceClassification", "CLS", "classify", False),
    # llama-nemotron-embed / nemotron-rerank: Llama weights, bidirectional attention
    "LlamaBidirectionalModel":
        ModelEntry("llama_bidirectional", "LlamaBidirectionalModel", "MEAN", "embed", False),
    "LlamaBidirectionalForSequenceClassification":
        ModelEntry("llama_bidirectional", "LlamaBidirectionalModel", "MEAN", "classify",
                   False),
    "BgeM3EmbeddingModel": ModelEntry("bge_m3", "BgeM3EmbeddingModel", "CLS", "embed", False,
                                      extra_tasks=("token_classify",)),
    "BertSpladeSparseEmbeddingModel":
        ModelEntry("splade", "BertSpladeSparseEmbeddingModel", "SPLADE", "embed", False),
    "HF_ColBERT": ModelEntry("colbert", "ColBERTBertModel", "ALL", "embed", False, True),
    # jina-colbert-v2: jina's rotary XLM-R + the ColBERT projection
    "ColBERTJinaRobertaModel": ModelEntry("colbert", "ColBERTJinaRobertaModel", "ALL", "embed",
                                          False, True, task_adapters=True),
    "ColBERTModernBertModel":
        ModelEntry("colbert", "ColBERTModernBertModel", "ALL", "embed", False, True),
    "CLIPModel": ModelEntry("clip", "CLIPEmbeddingModel", "LAST", "embed", False,
                            multimodal=True),
    "SiglipModel": ModelEntry("siglip", "SiglipEmbeddingModel", "LAST", "embed", False,
                              multimodal=True),
    "Siglip2Model": ModelEntry("siglip", "Siglip2EmbeddingModel", "LAST", "embed", False,
                               multimodal=True),
    "Qwen2VLForConditionalGeneration": ModelEntry("qwen2_vl", "Qwen2VLEmbeddingModel", "LAST",
                                                  "embed", True, multimodal=True),
    # jina-reranker-m0: Qwen2-VL + an MLP score head (hf_overrides JinaVLForSequenceClassification)
    "JinaVLForRanking": ModelEntry("qwen2_vl", "Qwen2VLEmbeddingModel", "LAST", "classify",
                                   True, multimodal=True),
    "JinaVLForSequenceClassification": ModelEntry("qwen2_vl", "Qwen2VLEmbeddingModel", "LAST",
                                                  "classify", True, multimodal=True),
    # Qwen3-VL-Embedding; Qwen3-VL-Reranker as Qwen3VLForSequenceClassification (hf_overrides)
    "Qwen3VLForConditionalGeneration": ModelEntry("qwen3_vl", "Qwen3VLEmbeddingModel", "LAST",
                                                  "embed", True, multimodal=True),
    "Gemma2ForCausalLM": ModelEntry("gemma", "Gemma2Model", "LAST", "embed", True),
    "Gemma2Model": ModelEntry("gemma", "Gemma2Model", "LAST", "embed", True),
    "Gemma3ForCausalLM": ModelEntry("gemma", "Gemma3Model", "LAST", "embed", True),
    "Gemma3TextModel": ModelEntry("gemma", "Gemma3Model", "LAST", "embed", True),
}
for _prefix, _module in _DECODERS.items():
    _cls = {"Qwen2": "Qwen2Model", "Qwen3": "Qwen3Model", "Llama": "LlamaModel",
            "Mistral": "LlamaModel"}[_prefix]
    _REGISTRY[f"{_prefix}ForCausalLM"] = ModelEntry(_module, _cls, "LAST", "embed", True)
    _REGISTRY[f"{_prefix}Model"] = ModelEntry(_module, _cls, "LAST", "embed", True)
# Names upstream vLLM serves with its Llama code: checkpoints of the Llama layout under
# another name (an old spelling, and families whose remote code is Llama's).
for _alias in ("LLaMAForCausalLM", "InternLM3ForCausalLM", "IQuestCoderForCausalLM",
               "TeleChat3ForCausalLM"):
    _REGISTRY[_alias] = _REGISTRY["LlamaForCausalLM"]

# Architectures whose config selects another implementation: an XLM-R config with rotary
# positions is jina's flash layout (jina-embeddings-v3), as upstream dispatches it.
_CONFIG_VARIANTS: dict[str, ModelEntry] = {
    "XLMRobertaModel": ModelEntry("jina_roberta", "JinaRobertaModel", "CLS", "embed", False,
                                  task_adapters=True),
}


def is_rotary_xlmr(hf_config) -> bool:
    """An XLM-R config of jina's rotary flash layout (upstream's test: the position type)."""
    return getattr(hf_config, "position_embedding_type", "absolute") in ("rotary", "rope")


def config_variant(arch: str, hf_config) -> Optional[ModelEntry]:
    """The implementation `hf_config` selects for `arch` instead of its table entry, or
    None (no config given, or the ordinary layout)."""
    if hf_config is None or arch not in _CONFIG_VARIANTS:
        return None
    return _CONFIG_VARIANTS[arch] if is_rotary_xlmr(hf_config) else None


# Suffixes that an unregistered architecture may carry on top of a registered causal base.
_ADAPTER_SUFFIXES = {
    "ForSequenceClassification": ("classify", "LAST"),
    "ForTokenClassification": ("classify", "ALL"),
    "ForProcessRewardModel": ("reward", "STEP"),
    "ForRewardModel": ("reward", "ALL"),
    "ForRewardModeling": ("reward", "ALL"),
    "RewardModel": ("reward", "ALL"),
    "ForTextEncoding": ("embed", "LAST"),
    "EmbeddingModel": ("embed", "LAST"),
}


@dataclass(frozen=True)
class ResolvedArch:
    """A served architecture: the base class to build plus the adapter (if any) on top."""

    architecture: str
    base: ModelEntry
    adapter: Optional[str]   # None | "classify" | "reward" | "embed"
    default_pooling_type: str
    native_convert: str


# A bidirectional decoder's `pooling` config field (llama-nemotron) -> its pooling type.
_POOLING_FIELD = {"avg": "MEAN", "cls": "CLS", "last": "LAST"}


def config_pooling_type(hf_config) -> Optional[str]:
    """A pooling type the checkpoint's config fixes for its classifier head (ModernBERT's
    `classifier_pooling`, a bidirectional Llama's `pooling`), or None."""
    if any("Bidirectional" in a for a in getattr(hf_config, "architectures", None) or ()):
        field = getattr(hf_config, "pooling", None)
        if field is not None and field not in _POOLING_FIELD:
            raise ValueError(f"pooling {field!r} in the config of a bidirectional model is "
                             f"not supported (supported: {', '.join(_POOLING_FIELD)}).")
        return _POOLING_FIELD.get(field)
    mode = getattr(hf_config, "classifier_pooling", None)
    return {"cls": "CLS", "mean": "MEAN"}.get(mode) if isinstance(mode, str) else None


def supported_architectures() -> list[str]:
    names = set(_REGISTRY)
    for prefix in (*_DECODERS, "Gemma2", "Gemma3", "Gemma3Text"):
        names.update(f"{prefix}{suffix}" for suffix in
                     ("ForSequenceClassification", "ForTokenClassification", "ForRewardModel",
                      "ForProcessRewardModel"))
    return sorted(names)


def _text_base_fits(base: ModelEntry, hf_config) -> bool:
    """A text-only native base cannot read a vision-language checkpoint's nested config
    (Gemma3ForSequenceClassification over Gemma3Config): that one is not native."""
    return base.multimodal or getattr(hf_config, "vision_config", None) is None


def resolve_architecture(arch: str, hf_config=None) -> ResolvedArch:
    """Find how to serve `arch` (with `hf_config`: its config variant, if any); raise
    ValueError listing the supported ones."""
    variant = config_variant(arch, hf_config)
    if variant is not None:
        return ResolvedArch(arch, variant, None, variant.default_pooling_type, variant.convert)
    if arch in _REGISTRY:
        e = _REGISTRY[arch]
        return ResolvedArch(arch, e, None, e.default_pooling_type, e.convert)
    for suffix, (convert, pooling) in _ADAPTER_SUFFIXES.items():
        if not arch.endswith(suffix):
            continue
        prefix = arch[: -len(suffix)]
        for base_name in (f"{prefix}ForCausalLM", f"{prefix}Model",
                          f"{prefix}ForConditionalGeneration"):
            base = _REGISTRY.get(base_name)
            if base is not None and base.is_causal and _text_base_fits(base, hf_config):
                return ResolvedArch(arch, base, convert, pooling, convert)
    raise ValueError(
        f"Model architecture {arch!r} is not supported. Supported architectures: "
        f"{', '.join(supported_architectures())} (and any registered causal LM with a "
        f"ForSequenceClassification / ForTokenClassification / ForRewardModel suffix).")


def convert_architecture(arch: ResolvedArch, convert: str) -> ResolvedArch:
    """Serve `arch` for another task: a causal base gets the task's adapter head; an
    encoder classifier may only be served as its bare `*Model` for embeddings."""
    if convert == arch.native_convert:
        return arch
    name = arch.architecture
    if arch.base.is_causal:
        adapter = None if convert == "embed" else convert
        pooling = {"embed": "LAST", "classify": "LAST", "reward": "ALL"}[convert]
        return ResolvedArch(name, arch.base, adapter, pooling, convert)
    prefix = name.split("For", 1)[0] if "For" in name else name[: -len("Model")]
    bare = _REGISTRY.get(f"{prefix}Model")
    if convert != "embed" or bare is None:
        raise ValueError(f"{name} is an encoder model and cannot be converted to "
                         f"{convert!r}; it can be served as its native "
                         f"{arch.native_convert!r} task" +
                         (" or with convert='embed'." if bare is not None else "."))
    return ResolvedArch(name, bare, None, bare.default_pooling_type, "embed")


def load_model_class(entry: ModelEntry):
    module = importlib.import_module(f"vllm.model_executor.models.{entry.module}")
    return getattr(module, entry.class_name)
