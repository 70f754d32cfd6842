"""Locate a checkpoint and read its Hugging Face config."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from transformers import AutoConfig, PretrainedConfig

from vllm import envs
from vllm.logger import init_logger

logger = init_logger(__name__)


def resolve_model_path(model: str, revision: Optional[str] = None) -> Path:
    """A local directory as is; otherwise the Hugging Face cache or hub snapshot."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    from huggingface_hub import constants, snapshot_download
    offline = envs.HF_HUB_OFFLINE
    try:
        return Path(snapshot_download(model, revision=revision, local_files_only=offline))
    except Exception as exc:  # noqa: BLE001 - re-raised with the facts a user needs
        try:
            return Path(snapshot_download(model, revision=revision, local_files_only=True))
        except Exception:
            pass
        raise ValueError(
            f"Could not find model {model!r}: it is not a local directory and it is not in the "
            f"Hugging Face cache at {constants.HF_HUB_CACHE} (and the hub could not be reached: "
            f"{type(exc).__name__}). Pass a local path or download the model first.") from None


# How transformers says it does not know a config.json's model_type (with and without an
# auto_map naming remote code).
_REMOTE_MODEL_TYPE = ("trust_remote_code", "does not recognize this architecture")


def load_hf_config(path: Path, hf_overrides: Optional[dict[str, Any]] = None,
                   trust_remote_code: bool = False) -> PretrainedConfig:
    """Read config.json with transformers and apply `hf_overrides` attribute by attribute.

    A `model_type` transformers does not know (the checkpoint's configuration code ships
    with it or with another repository, e.g. gte-multilingual's `new`) is read as a plain
    `PretrainedConfig` of config.json's keys: no remote code runs, and the native
    implementation named by `architectures` (or `hf_overrides`) reads the keys it needs.
    `trust_remote_code=True` (asked for only when the checkpoint's own model class will be
    served) runs its configuration code instead, as transformers' AutoConfig does."""
    config = _read_config(path, trust_remote_code)
    for key, value in (hf_overrides or {}).items():
        setattr(config, key, value)
    if not getattr(config, "architectures", None):
        raise ValueError(f"{path}/config.json names no `architectures`; pass "
                         "hf_overrides={'architectures': [...]} to choose one.")
    return config


def _read_config(path: Path, trust_remote_code: bool) -> PretrainedConfig:
    if trust_remote_code:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=True)
    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except ValueError as exc:
        raw = read_json(path / "config.json")
        if raw is None or not any(why in str(exc) for why in _REMOTE_MODEL_TYPE):
            raise
        logger.info("config.json's model_type %r is not in transformers (its code is remote); "
                    "read as a plain config of its keys.", raw.get("model_type"))
        return PretrainedConfig.from_dict(raw)


def read_json(path: Path) -> Optional[dict]:
    if not path.is_file():
        return None
    with open(path) as f:
        return json.load(f)


def roberta_position_offset(hf_config: PretrainedConfig) -> int:
    """RoBERTa numbers non-padding tokens from padding_idx + 1 (a pad_token_id of 0 counts)."""
    pad = getattr(hf_config, "pad_token_id", None)
    return (1 if pad is None else pad) + 1
