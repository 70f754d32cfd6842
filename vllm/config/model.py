"""ModelConfig: what checkpoint we serve and how (architecture, convert, pooling, lengths)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
from transformers import PretrainedConfig

from vllm.config.limits import ModelLimits
from vllm.config.pooler import PoolerConfig
from vllm.config.tasks import ModelTasks, token_head_method
from vllm.logger import init_logger
from vllm.model_executor.models.registry import (ResolvedArch, config_pooling_type,
                                                 convert_architecture)
from vllm.model_executor.models.transformers_arch import (convert_backend_architecture,
                                                          resolve_model_impl, routing_refusal,
                                                          serves_remote)
from vllm.model_executor.models.transformers_remote import RemoteCode
from vllm.transformers_utils.config import load_hf_config, resolve_model_path
from vllm.transformers_utils.score_template import load_score_template
from vllm.transformers_utils.st_config import SentenceTransformersConfig, load_st_config

logger = init_logger(__name__)

_TASK_TO_CONVERT = {"embed": "embed", "embedding": "embed", "classify": "classify",
                    "score": "classify", "reward": "reward"}


@dataclass
class ModelConfig(ModelTasks, ModelLimits):
    """User-facing model settings plus everything resolved from the checkpoint at start-up."""

    model: str
    tokenizer: Optional[str] = None
    runner: str = "auto"
    convert: str = "auto"
    task: Optional[str] = None
    dtype: Union[str, torch.dtype] = "auto"
    quantization: Optional[str] = None               # "int8": the backbone's projections
    max_model_len: Optional[int] = None
    hf_overrides: Optional[dict[str, Any]] = None
    override_pooler_config: Optional[Union[PoolerConfig, dict]] = None
    trust_remote_code: bool = False
    revision: Optional[str] = None
    model_impl: str = "auto"                         # auto | vllm | transformers
    device: str = "auto"
    seed: int = 0
    # Long inputs and compact outputs (request defaults; see docs/architecture.md)
    truncation_side: Optional[str] = None            # None: the tokenizer's own side
    embedding_calibration: Optional[str] = None      # int8/uint8 ranges file
    rerank_max_chunks_per_doc: int = 0               # 0: a too-long rerank document is a 400
    # Images (see vllm/multimodal): per-prompt counts and where images may come from
    limit_mm_per_prompt: Optional[dict[str, Any]] = None  # {"image": N}
    allowed_local_media_path: Optional[str] = None   # file:// URLs under this directory
    allowed_media_domains: Optional[list[str]] = None  # http(s) hosts that may be fetched
    # A score template (file path or Jinja text) for LLM rerankers: --chat-template
    chat_template: Optional[Union[str, Path]] = None

    # Resolved in __post_init__.
    path: Path = field(init=False)
    hf_config: PretrainedConfig = field(init=False)
    arch: ResolvedArch = field(init=False)
    st_config: Optional[SentenceTransformersConfig] = field(init=False)
    pooler_config: PoolerConfig = field(init=False)
    impl: str = field(init=False)                    # "vllm" (native) or "transformers"
    # The Transformers backend runs each request whole with the class's own attention
    # (it cannot take the engine's): prefix caching and chunked prefill stay off.
    whole_sequences: bool = field(init=False, default=False)
    whole_reason: Optional[str] = field(init=False, default=None)
    # The checkpoint's own model classes (auto_map) when the Transformers backend serves
    # one of them (trust_remote_code=True); None otherwise.
    remote_code: Optional[RemoteCode] = field(init=False, default=None)
    # The text of `chat_template` (read at start-up, so a bad path fails there).
    score_template: Optional[str] = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.path = resolve_model_path(self.model, self.revision)
        self.tokenizer = self.tokenizer or str(self.path)
        self.hf_config = load_hf_config(self.path, self.hf_overrides)
        self.st_config = load_st_config(self.path)
        self._apply_sparse_encoder()
        self._resolve_runner_and_convert()
        self.pooler_config = self._resolve_pooler_config()
        logger.info("Pooling task: %s (%s; the model supports %s).", self.pooling_task,
                    "from PoolerConfig.task" if self.pooler_config.task else "by default",
                    list(self.pooling_tasks))
        if self.pooler_config.dimensions is not None:  # every embed request's default
            self.verify_dimensions(self.pooler_config.dimensions)
        self.device = self._resolve_device()
        self.dtype = self._resolve_dtype()
        self._check_quantization()
        self.max_model_len = self._resolve_max_model_len()
        self._check_long_input_settings()
        self._check_media_settings()
        self.score_template = load_score_template(self.chat_template)
        token_head_method(self.hf_config)  # a bad classifier_from_token / method fails here

    def _apply_sparse_encoder(self) -> None:
        """A sentence-transformers SparseEncoder (MLM transformer + SpladePooling) is served
        as upstream's BertSpladeSparseEmbeddingModel with its pooling settings."""
        splade = self.st_config.splade if self.st_config is not None else None
        if splade is None:
            return
        arch = self.hf_config.architectures[0]
        if arch not in ("BertForMaskedLM", "BertSpladeSparseEmbeddingModel"):
            raise ValueError(f"SpladePooling is supported on BERT masked-LM checkpoints; this "
                             f"one is {arch}.")
        self.hf_config.architectures = ["BertSpladeSparseEmbeddingModel"]
        self.hf_config.splade_pooling, self.hf_config.splade_activation = splade
        logger.info("sentence-transformers SparseEncoder: served as "
                    "BertSpladeSparseEmbeddingModel (pooling %s, activation %s)", *splade)

    # ----- runner / convert ------------------------------------------------------------
    def _resolve_runner_and_convert(self) -> None:
        if self.task is not None:
            warnings.warn("`task` is deprecated; use `runner='pooling'` and `convert=...`.",
                          DeprecationWarning, stacklevel=4)
            if self.task not in _TASK_TO_CONVERT:
                raise ValueError(f"task={self.task!r} is not a pooling task; use one of "
                                 f"{sorted(set(_TASK_TO_CONVERT))}.")
            if self.convert == "auto":
                self.convert = _TASK_TO_CONVERT[self.task]
                if self.task == "score" and resolve_model_impl(
                        self.hf_config.architectures[0], self.model_impl, self.hf_config,
                        self._remote())[0].native_convert == "embed":
                    self.convert = "embed"  # as upstream: an embedding model scores by cosine
        if self.runner not in ("auto", "pooling"):
            raise ValueError(f"runner={self.runner!r} is not supported: this engine serves "
                             "pooling models only; use runner='pooling' (or 'auto').")
        self.runner = "pooling"
        arch_name = self.hf_config.architectures[0]
        arch = self._resolve_impl(arch_name)
        if self.convert not in ("auto", "none", "embed", "classify", "reward"):
            raise ValueError(f"convert={self.convert!r} is not supported; use one of auto, "
                             "embed, classify, reward.")
        convert = arch.native_convert if self.convert in ("auto", "none") else self.convert
        arch = convert_backend_architecture(arch, convert) if self.impl == "transformers" \
            else convert_architecture(arch, convert)
        self.arch = arch
        self.convert = convert
        how = "converted from a causal LM" if arch_name.endswith(("ForCausalLM", "LMHeadModel")) \
            and convert == "embed" else "by architecture"
        logger.info("Resolved architecture: %s, runner: pooling, convert: %s (%s)",
                    arch_name, convert, how)

    def _resolve_impl(self, arch_name: str) -> ResolvedArch:
        """Native class or Transformers backend (`model_impl`), logged with the reason;
        on the backend, whether its attention can run on the engine's."""
        remote = self._remote()
        arch, self.impl, why = resolve_model_impl(arch_name, self.model_impl, self.hf_config,
                                                  remote)
        logger.info("Model implementation for %s: %s (%s).", arch_name,
                    "Transformers backend" if self.impl == "transformers" else "native", why)
        if self.impl == "transformers":
            if self.quantization is not None:
                raise ValueError(f"quantization={self.quantization!r} applies to the "
                                 "engine's own projections; the Transformers backend runs "
                                 "transformers' layers. Leave quantization unset.")
            if serves_remote(arch_name, remote):  # its own config class, too
                self.remote_code = remote
                self.hf_config = load_hf_config(self.path, self.hf_overrides,
                                                trust_remote_code=True)
            reason = routing_refusal(self.hf_config, self.remote_code)
            if reason is not None:
                self.mark_whole_sequences(reason)
        return arch

    def _remote(self) -> Optional[RemoteCode]:
        """The model classes the checkpoint ships (auto_map), trusted per the flag."""
        return RemoteCode.of(self.hf_config, self.path, self.trust_remote_code)

    def mark_whole_sequences(self, reason: str) -> None:
        """The Transformers backend cannot route this class's attention: every request
        runs whole, so prefix caching and chunked prefill are off (one WARNING)."""
        self.whole_sequences, self.whole_reason = True, reason
        logger.warning("Transformers backend: %s, so each request runs whole with the "
                       "class's own attention; prefix caching and chunked prefill are off.",
                       reason)

    # ----- pooler config -------------------------------------------------------------
    def _resolve_pooler_config(self) -> PoolerConfig:
        user = self.override_pooler_config
        if isinstance(user, dict):
            user = PoolerConfig.from_dict(user)
        cfg = user.model_copy() if user is not None else PoolerConfig()
        sources = []
        if user is not None and user.pooling_type is not None:
            sources.append("pooling_type from the user override")
        st = self.st_config
        if cfg.pooling_type is None and st is not None and st.pooling_type is not None:
            cfg.pooling_type = st.pooling_type
            sources.append("pooling_type from the sentence-transformers Pooling config")
        # a bidirectional Llama's `pooling` holds for every task; `classifier_pooling` for
        # the classifier head only
        fixed = config_pooling_type(self.hf_config)
        if cfg.pooling_type is None and fixed is not None and (
                "Bidirectional" in self.arch.architecture
                or (self.convert == "classify" and not self.is_token_classifier)):
            cfg.pooling_type = fixed
            sources.append("pooling_type from the config's pooling field")
        if cfg.pooling_type is None:
            cfg.pooling_type = self.arch.default_pooling_type
            sources.append(f"pooling_type from the class default of {self.arch.architecture}")
        if self.convert == "embed" and cfg.normalize is None:
            # Sparse (SPLADE) weights are never normalised by default.
            cfg.normalize = st.normalize if st is not None else cfg.pooling_type != "SPLADE"
            sources.append("normalize from " + ("the sentence-transformers modules"
                                                 if st is not None else "the embed default"))
        if self.convert in ("classify",) and cfg.activation is None:
            cfg.activation = True
        if self.convert == "reward" and cfg.softmax is None:
            cfg.softmax = False
        logger.info("Pooling config resolved: %s", "; ".join(sources))
        return cfg

    @property
    def is_multimodal(self) -> bool:
        """Whether prompts may carry images (a registered multimodal architecture)."""
        return self.arch.base.multimodal

    def mm_limit(self, modality: str) -> int:
        """How many items of `modality` one prompt may hold (default 1; 0 when the model
        takes none)."""
        if not self.is_multimodal:
            return 0
        value = (self.limit_mm_per_prompt or {}).get(modality, 1)
        if isinstance(value, dict):
            value = value.get("count", 1)
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"limit_mm_per_prompt[{modality!r}] must be a count >= 0; got "
                             f"{value!r}.")
        return value

    @property
    def media_policy(self):
        """Where this server's images may come from (vllm.multimodal.media)."""
        from vllm.multimodal.media import MediaPolicy
        return MediaPolicy(self.allowed_local_media_path,
                           tuple(d.lower() for d in self.allowed_media_domains or ()))

    @property
    def prompts(self) -> dict[str, str]:
        """sentence-transformers' prompts by name; a model with task adapters also knows
        each task by name (its config's `task_instructions` text unless ST says else)."""
        st = dict(self.st_config.prompts) if self.st_config else {}
        if not self.task_adapters:
            return st
        text = getattr(self.hf_config, "task_instructions", None) or {}
        return {**{task: str(text.get(task, "")) for task in self.task_adapters}, **st}

    @property
    def task_adapters(self) -> tuple[str, ...]:
        """The checkpoint's per-task LoRA adapters (jina-embeddings-v3's
        `lora_adaptations`), chosen per request by its prompt name; empty for others."""
        if not self.arch.base.task_adapters:
            return ()
        return tuple(getattr(self.hf_config, "lora_adaptations", None) or ())

    @property
    def default_task_adapter(self) -> Optional[str]:
        """The adapter of a request that names no task: the last one (text-matching in
        jina-embeddings-v3's order), the one upstream merges into the weights."""
        return self.task_adapters[-1] if self.task_adapters else None

    @property
    def default_prompt_name(self) -> Optional[str]:
        return self.st_config.default_prompt_name if self.st_config else None

    # ----- facts used by the gate, heads and entrypoints -------------------------------
    @property
    def architecture(self) -> str:
        return self.arch.architecture

    @property
    def is_causal(self) -> bool:
        """Causal attention: a decoder class, `is_causal` not set false in the config and
        no `use_bidirectional_attention: true` (EmbeddingGemma)."""
        return self.arch.base.is_causal and getattr(self.hf_config, "is_causal", True) \
            is not False and not getattr(self.hf_config, "use_bidirectional_attention", False)

    @property
    def is_cross_encoder(self) -> bool:
        return self.convert == "classify"

    @property
    def matryoshka_dimensions(self) -> Optional[list[int]]:
        return getattr(self.hf_config, "matryoshka_dimensions", None)

    @property
    def is_matryoshka(self) -> bool:
        return bool(getattr(self.hf_config, "is_matryoshka", False)
                    or self.matryoshka_dimensions)

    def verify_dimensions(self, dimensions: int) -> None:
        if not self.is_matryoshka:
            raise ValueError(f"Model {self.model!r} does not support matryoshka "
                             "representation, changing output dimensions will lead to poor "
                             "results. Leave `dimensions` unset.")
        if dimensions < 1:
            raise ValueError("dimensions must be at least 1.")
        allowed = self.matryoshka_dimensions
        if allowed and dimensions not in allowed:
            raise ValueError(f"Model {self.model!r} only supports Matryoshka dimensions "
                             f"{allowed}, got {dimensions}.")  # upstream 0.33's wording

    @property
    def score_activation(self) -> str:
        """The cross-encoder's activation name: 'sigmoid', 'identity', 'softmax', 'tanh'."""
        st = getattr(self.hf_config, "sentence_transformers", None) or {}
        name = (st.get("activation_fn") if isinstance(st, dict) else None) or getattr(
            self.hf_config, "sbert_ce_default_activation_function", None)
        if not name:
            return "sigmoid" if self.num_labels == 1 else "softmax"
        short = name.rsplit(".", 1)[-1].lower()
        if short not in ("sigmoid", "identity", "softmax", "tanh"):
            raise ValueError(f"cross-encoder activation {name!r} is not supported")
        return short

    @property
    def id2label(self) -> dict[int, str]:
        mapping = getattr(self.hf_config, "id2label", None) or {}
        return {int(k): v for k, v in mapping.items()}

    @property
    def hidden_size(self) -> int:
        return self.hf_config.hidden_size

    @property
    def uses_token_type_ids(self) -> bool:
        """Segment ids reach the model: native BERT, and any Transformers-backend encoder
        with more than one token type (Electra), as transformers feeds them."""
        return (self.hf_config.model_type == "bert" or (
            self.impl == "transformers" and not self.is_causal)) and \
            (getattr(self.hf_config, "type_vocab_size", 0) or 0) > 1
