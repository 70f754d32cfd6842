"""The Transformers backend: a `transformers` base model as the engine's backbone.

`TransformersModel` wraps the checkpoint's transformers base class (Phi3Model,
DistilBertModel, ...), or the checkpoint's own AutoModel class (`auto_map`, under
`trust_remote_code=True`: `transformers_remote.py`), with the engine's backbone interface,
`forward(input_ids[T], positions[T], meta) -> hidden_states[T, H]` over the flat,
padding-free step. Where the class takes an external attention function, the whole step
runs as one sequence [1, T] whose attention goes through the engine's `Attention` layers
(`transformers_attention.py`): paged KV cache, the platform's backend, prefix caching and
chunked prefill as for native models. Where it cannot (`whole_sequences`), the step's
requests run as one right-padded batch with an attention mask and the class's own
attention; the config then keeps prefix caching and chunked prefill off, so every request
arrives whole.

transformers loads the weights itself (`from_pretrained`): its key renames and tensor
conversions (fused MoE experts in transformers 5, legacy names) apply as in the reference.
Causal task heads (`score`) stay the engine's, loaded by the model loader; an encoder
classifier loads its transformers task class and keeps that class's own head
(`transformers_heads.TaskHead`), its backbone served here. LoRA adapters target the
model's `nn.Linear` projections (`transformers_lora.py`), in both step layouts.
"""
from __future__ import annotations

import copy
import inspect
from typing import Iterable, Optional

import torch
from torch import nn

from vllm.attention.metadata import AttentionMetadata
from vllm.logger import init_logger
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.models.transformers_arch import base_model_class, encoder_task_class
from vllm.model_executor.lora_target import LoRATarget
from vllm.model_executor.models.transformers_attention import (ATTN_IMPLEMENTATION,
                                                               STEP_KWARG, AttentionProbe,
                                                               attach_engine_layers)
from vllm.model_executor.models.transformers_lora import RowLayout, lora_target, wrap_linears

logger = init_logger(__name__)


class TransformersModel(nn.Module):
    """A transformers base model behind the engine's backbone interface."""

    default_pooling_type = "LAST"
    tied_weights: dict[str, str] = {}

    @classmethod
    def from_model_config(cls, mc) -> "TransformersModel":
        """Build and load from a ModelConfig (the loader's hook for self-loading backbones)."""
        causal = mc.arch.base.is_causal
        remote = mc.remote_code
        return cls(mc.hf_config, str(mc.path), causal, mc.whole_sequences, mc.device,
                   encoder_task_class(mc.architecture, mc.convert, causal, remote), remote)

    def __init__(self, config, path: str, causal: bool, whole_sequences: bool,
                 device: str = "cpu", task_cls=None, remote=None) -> None:
        super().__init__()
        self.config = config
        self.is_causal = causal
        self.whole_sequences = whole_sequences
        self.whole_reason: Optional[str] = None
        hf_cls = task_cls or base_model_class(config, remote)
        loaded = _load_pretrained(hf_cls, config, path,
                                  None if whole_sequences else ATTN_IMPLEMENTATION).to(device)
        # An encoder classifier: the task model's backbone here, its head for the loader.
        self.hf = getattr(loaded, loaded.base_model_prefix) if task_cls else loaded
        self._task_head = (_task_head(loaded, config),) if task_cls else ()
        self.weight_prefix = hf_cls.base_model_prefix + "."
        params = inspect.signature(type(self.hf).forward).parameters
        self._takes = {name for name in ("token_type_ids", "use_cache") if name in params}
        self._layers: list[Attention] = []
        if not whole_sequences:
            self._route_attention()
        self.position_offset = 0 if causal else _position_offset(self.hf)
        pad = getattr(config, "pad_token_id", None)
        self._pad_id = pad if isinstance(pad, int) else 0
        self._rows = RowLayout()

    # ----- attention routing ------------------------------------------------------------
    def _route_attention(self) -> None:
        """Probe one forward: which modules call the attention function, with what
        shapes. A class that never calls it (or calls it oddly) runs whole sequences."""
        probe = AttentionProbe()
        pad = getattr(self.config, "pad_token_id", None)  # no padding in the probe
        ids = torch.tensor([[i for i in range(4) if i != pad][:3]], device=self.hf.device)
        with torch.inference_mode():
            self.hf(input_ids=ids, **self._extra_kwargs(), **{STEP_KWARG: probe})
        problem = probe.problem or (None if probe.modules else
                                    "the attention function was never called")
        for module in probe.modules:
            module_causal = getattr(module, "is_causal", None)
            if problem is None and module_causal is not None and \
                    bool(module_causal) != self.is_causal:
                raise ValueError(
                    f"{type(module).__name__} is {'' if module_causal else 'not '}causal in "
                    f"transformers, but the model type {self.config.model_type!r} was taken "
                    f"as {'causal' if self.is_causal else 'bidirectional'}; this class cannot "
                    "be served on the Transformers backend yet.")
        if problem is not None:
            self.whole_sequences, self.whole_reason = True, problem
            self.hf.set_attn_implementation("sdpa" if self.hf._supports_sdpa else "eager")
            return
        self._layers = attach_engine_layers(probe)
        logger.info("Transformers backend: %d attention layers of %s run on the engine's "
                    "attention (%s).", len(self._layers), type(self.hf).__name__,
                    "paged KV cache" if self.is_causal else "bidirectional, no cache")

    def attention_layers(self) -> list[Attention]:
        return list(self._layers)

    # ----- LoRA -------------------------------------------------------------------------
    def prepare_lora(self) -> None:
        """enable_lora: the model's `nn.Linear` projections take the step's LoRA add."""
        count = wrap_linears(self.hf, self._rows)
        logger.info("Transformers backend: %d nn.Linear projections of %s can take LoRA "
                    "adapters.", count, type(self.hf).__name__)

    def lora_target(self, module: str) -> LoRATarget:
        return lora_target(self.hf, module)

    # ----- forward ----------------------------------------------------------------------
    def _extra_kwargs(self, token_type_ids: Optional[torch.Tensor] = None) -> dict:
        kwargs = {"use_cache": False} if "use_cache" in self._takes else {}
        if token_type_ids is not None and "token_type_ids" in self._takes:
            kwargs["token_type_ids"] = token_type_ids[None]
        return kwargs

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, token_type_ids: Optional[torch.Tensor] = None,
                **unused) -> torch.Tensor:
        if self.whole_sequences:
            hidden = self._forward_whole(input_ids, meta, token_type_ids)
        else:
            out = self.hf(input_ids=input_ids[None],
                          position_ids=(positions + self.position_offset)[None],
                          **self._extra_kwargs(token_type_ids), **{STEP_KWARG: meta})
            hidden = out[0][0]
        return hidden if meta.output_rows is None else hidden[meta.output_rows]

    def _forward_whole(self, input_ids: torch.Tensor, meta: AttentionMetadata,
                       token_type_ids: Optional[torch.Tensor]) -> torch.Tensor:
        """The step's requests as one right-padded batch with an attention mask (each
        request from its first token; no request attends to another's tokens or to
        padding), then back to the flat [T, H] layout."""
        starts, lengths = meta.query_start_loc, meta.num_new
        if any(meta.num_computed):
            raise RuntimeError("a whole-sequence Transformers backbone got a request "
                               "part-way through (prefix caching / chunking must be off)")
        rows, width = len(lengths), max(lengths)
        ids = input_ids.new_full((rows, width), self._pad_id)
        mask = input_ids.new_zeros((rows, width))
        types = None if token_type_ids is None else input_ids.new_zeros((rows, width))
        for i, n in enumerate(lengths):
            ids[i, :n] = input_ids[starts[i]: starts[i] + n]
            mask[i, :n] = 1
            if types is not None:
                types[i, :n] = token_type_ids[starts[i]: starts[i] + n]
        kwargs = self._extra_kwargs()
        if types is not None and "token_type_ids" in self._takes:
            kwargs["token_type_ids"] = types
        self._rows.padded(mask)
        try:
            hidden = self.hf(input_ids=ids, attention_mask=mask, **kwargs)[0]
        finally:
            self._rows.padded(None)
        return hidden[mask.bool()]

    # ----- weights ----------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """transformers already loaded the backbone (`from_pretrained`); nothing to copy."""
        for _ in weights:
            pass
        return set(dict(self.named_parameters()))

    @staticmethod
    def skip_weight(name: str) -> bool:
        return True   # every backbone tensor was loaded by transformers

    def build_classifier(self, config, num_labels: int, names: set[str]) -> nn.Module:
        """An encoder classifier's own transformers head (already loaded), else the
        engine's `score` head over a causal backbone."""
        if self._task_head:
            return self._task_head[0]
        from vllm.model_executor.models.adapters import ScoreHead
        hidden = config.get_text_config().hidden_size  # a VLM's classifier: its text model's
        return ScoreHead(hidden, num_labels, bias="score.bias" in names)


def _task_head(task_model: nn.Module, config) -> nn.Module:
    from vllm.model_executor.models.transformers_heads import TaskHead, check_reads_its_rows
    arch = type(task_model).__name__
    head = TaskHead(task_model, per_token=arch.endswith("ForTokenClassification"))
    check_reads_its_rows(head, config.hidden_size, arch)
    return head


def _load_pretrained(hf_cls, config, path: str, attn: Optional[str]) -> nn.Module:
    """`hf_cls.from_pretrained` on a copy of the config (transformers writes its attention
    choice into the config); a checkpoint missing backbone weights is refused."""
    from transformers.utils import logging as hf_logging
    kwargs = {"attn_implementation": attn} if attn is not None else {}
    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # its load report lists the task head as unexpected
    hf_logging.disable_progress_bar()
    try:
        model, info = hf_cls.from_pretrained(path, config=copy.deepcopy(config),
                                             output_loading_info=True, dtype=torch.float32,
                                             **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    if info.get("missing_keys"):
        raise ValueError(f"Checkpoint {path} is missing weights for: "
                         f"{sorted(info['missing_keys'])[:8]}")
    return model.eval()


def _position_offset(hf: nn.Module) -> int:
    """RoBERTa-style encoders number positions from padding_idx + 1 (their position
    embedding has a padding_idx); others from 0."""
    for name, module in hf.named_modules():
        if name.endswith("position_embeddings") and isinstance(module, nn.Embedding) and \
                module.padding_idx is not None:
            return module.padding_idx + 1
    return 0
