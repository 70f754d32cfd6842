"""How long, on what device, in what dtype a model runs, and the checks of the settings
that go with them (quantization, long inputs, media limits).

A mixin of `ModelConfig`, which supplies the fields read here (`hf_config`, `st_config`,
`tokenizer`, `device`, `dtype`, `quantization`, `max_model_len`, `pooler_config`, ...).
"""
from __future__ import annotations

from pathlib import Path

import torch

from vllm import envs
from vllm.logger import init_logger
from vllm.platforms import platform_for, resolve_device
from vllm.transformers_utils.config import read_json, roberta_position_offset

logger = init_logger(__name__)

QUANTIZATIONS = ("int8",)
_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16}
# The config fields that state a position limit, in upstream's order; the smallest stated
# one holds (GPT-2-style configs such as NomicBertConfig say n_positions).
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                  "model_max_length", "max_target_positions", "max_sequence_length",
                  "max_seq_length", "seq_len")


class ModelLimits:
    """Device, dtype and length resolution, and the checks of their settings."""

    def _resolve_device(self) -> str:
        return resolve_device(self.device)

    def _check_quantization(self) -> None:
        """None or "int8" (float32 activations, on a CPU with int8 dot products)."""
        if self.quantization is None:
            return
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization={self.quantization!r} is not supported; use "
                             f"{' or '.join(map(repr, QUANTIZATIONS))}, or leave it unset.")
        if self.dtype != torch.float32:
            raise ValueError(f"quantization={self.quantization!r} runs float32 activations; "
                             f"pass dtype='float32' (not {str(self.dtype)[6:]}).")
        platform_for(self.device).check_quantization(self.quantization)

    def _resolve_dtype(self) -> torch.dtype:
        dtype = self.dtype
        if isinstance(dtype, torch.dtype):
            return dtype
        if dtype == "auto":
            ckpt = getattr(self.hf_config, "torch_dtype", None) or getattr(
                self.hf_config, "dtype", None)
            if isinstance(ckpt, str):
                ckpt = _DTYPES.get(ckpt)
            chosen = platform_for(self.device).default_dtype(ckpt)
            logger.info("dtype auto on %s: %s (checkpoint: %s).", self.device,
                        str(chosen)[6:], str(ckpt)[6:] if ckpt is not None else "not stated")
            return chosen
        if dtype not in _DTYPES:
            raise ValueError(f"dtype={dtype!r} is not supported; use auto, float32, bfloat16 "
                             "or float16.")
        return _DTYPES[dtype]

    def _position_limit(self) -> int:
        # a dual encoder's text tower holds the text positions (CLIP, SigLIP)
        text = getattr(self.hf_config, "text_config", None) if self.is_multimodal else None
        stated = [getattr(text or self.hf_config, key, None) for key in _POSITION_KEYS]
        limit = min((int(v) for v in stated if isinstance(v, (int, float)) and v > 0),
                    default=512)
        if self.hf_config.model_type in ("roberta", "xlm-roberta"):
            limit -= roberta_position_offset(self.hf_config)
        elif self.hf_config.model_type == "mpnet":  # numbered from padding_idx 1 + 1, always
            limit -= 2
        return int(limit)

    def _resolve_max_model_len(self) -> int:
        limit = self._position_limit()
        candidates = [limit]
        if self.st_config is not None and self.st_config.max_seq_length:
            candidates.append(int(self.st_config.max_seq_length))
        tok_cfg = read_json(Path(self.tokenizer) / "tokenizer_config.json") or {}
        tok_max = tok_cfg.get("model_max_length")
        if isinstance(tok_max, (int, float)) and 0 < tok_max < 1e9:
            candidates.append(int(tok_max))
        derived = min(candidates)
        if self.max_model_len is None:
            return derived
        if self.max_model_len == -1:
            return derived
        if self.max_model_len > limit:
            raise ValueError(
                f"max_model_len={self.max_model_len} is larger than the model's position limit "
                f"({limit}); pass max_model_len <= {limit}.")
        if self.max_model_len > derived:
            if not envs.VLLM_ALLOW_LONG_MAX_MODEL_LEN:
                raise ValueError(
                    f"User-specified max_model_len ({self.max_model_len}) is greater than the "
                    f"derived max_model_len ({derived}: the smallest of the position limit, the "
                    "sentence-transformers max_seq_length and the tokenizer's model_max_length)."
                    f" Pass max_model_len <= {derived}, or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
                    "to allow up to the position limit.")
            logger.warning("max_model_len=%d is above the derived %d "
                           "(VLLM_ALLOW_LONG_MAX_MODEL_LEN=1).", self.max_model_len, derived)
        if self.max_model_len < 1:
            raise ValueError("max_model_len must be positive.")
        return int(self.max_model_len)

    def _check_long_input_settings(self) -> None:
        if self.truncation_side not in (None, "left", "right"):
            raise ValueError(f"truncation_side must be 'left' or 'right'; got "
                             f"{self.truncation_side!r}.")
        if self.rerank_max_chunks_per_doc < 0:
            raise ValueError("rerank_max_chunks_per_doc must be 0 (off) or positive.")
        if self.embedding_calibration and not Path(self.embedding_calibration).is_file():
            raise ValueError(f"embedding_calibration file {self.embedding_calibration!r} "
                             "does not exist.")
        st = self.st_config
        if st is not None and st.prompts:
            logger.info("sentence-transformers prompts: %s; default_prompt_name: %s",
                        st.prompts, st.default_prompt_name)
        if st is not None and not st.include_prompt:
            logger.info("sentence-transformers Pooling include_prompt false: a prompt's "
                        "tokens are left out of %s pooling.", st.pooling_type)
        pc = self.pooler_config
        if pc.enable_chunked_processing:
            if self.convert != "embed":
                raise ValueError("enable_chunked_processing applies to embedding models only.")
            logger.info("Chunked processing: inputs up to %s tokens are embedded in chunks of "
                        "max_model_len=%d.", pc.max_embed_len or "any number of",
                        self.max_model_len)
        elif pc.max_embed_len is not None:
            raise ValueError("max_embed_len needs enable_chunked_processing: true in the "
                             "pooler config.")

    def _check_media_settings(self) -> None:
        """--limit-mm-per-prompt: image counts only, at most one for a dual encoder."""
        dual = self.is_multimodal and not self.is_causal
        for modality in (self.limit_mm_per_prompt or {}):
            if modality != "image":
                raise ValueError(f"limit_mm_per_prompt: only 'image' is supported; got "
                                 f"{modality!r}.")
        if dual and self.mm_limit("image") > 1:
            raise ValueError(f"{self.architecture} embeds one image per prompt; set "
                             "limit_mm_per_prompt's image count to 0 or 1.")
        if self.is_multimodal and self.pooler_config.enable_chunked_processing:
            raise ValueError(f"enable_chunked_processing does not apply to {self.architecture}: "
                             "an image is embedded whole.")
        if self.allowed_local_media_path and \
                not Path(self.allowed_local_media_path).is_dir():
            raise ValueError(f"allowed_local_media_path {self.allowed_local_media_path!r} "
                             "is not a directory.")
