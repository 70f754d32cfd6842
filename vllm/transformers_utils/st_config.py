"""Reader for sentence-transformers files (modules.json, Pooling, Dense, Normalize)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from vllm.transformers_utils.config import read_json

_POOLING_MODES = {
    "pooling_mode_cls_token": "CLS",
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_lasttoken": "LAST",
}
_UNSUPPORTED_MODES = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                      "pooling_mode_weightedmean_tokens")
_SUPPORTED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize", "MLMTransformer",
                      "SpladePooling")


@dataclass
class DenseSpec:
    path: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str   # e.g. "torch.nn.modules.activation.Tanh"


@dataclass
class SentenceTransformersConfig:
    pooling_type: Optional[str] = None
    # Pooling's include_prompt: False = a prompt's tokens are left out of the pooled
    # tokens (MEAN skips them, CLS takes the first token after them), as ST's Pooling.
    include_prompt: bool = True
    normalize: bool = False
    dense: list[DenseSpec] = field(default_factory=list)
    max_seq_length: Optional[int] = None
    do_lower_case: bool = False
    # config_sentence_transformers.json: named prompts (e.g. {"query": "query: "}) and the
    # one encode() applies when a request names none
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: Optional[str] = None
    # A SparseEncoder's SpladePooling: (pooling_strategy, activation_function).
    splade: Optional[tuple[str, str]] = None


def _module_kind(type_name: str) -> str:
    return type_name.rsplit(".", 1)[-1]


def load_st_config(path: Path) -> Optional[SentenceTransformersConfig]:
    """Parse the sentence-transformers files of `path`; None when it has none.

    Any module or pooling mode this engine cannot run is a ValueError, never dropped.
    """
    modules = read_json(path / "modules.json")
    if modules is None:
        return None
    cfg = SentenceTransformersConfig()
    for module in modules:
        kind = _module_kind(module.get("type", ""))
        if kind not in _SUPPORTED_MODULES:
            raise ValueError(
                f"sentence-transformers module {module.get('type')!r} in {path}/modules.json is "
                f"not supported (supported: {', '.join(_SUPPORTED_MODULES)}). Remove it from "
                "modules.json if the model does not need it.")
        mpath = path / module.get("path", "")
        if kind == "Pooling":
            cfg.pooling_type = _pooling_type(mpath)
            cfg.include_prompt = bool((read_json(mpath / "config.json") or {})
                                      .get("include_prompt", True))
        elif kind == "Dense":
            cfg.dense.append(_dense_spec(mpath))
        elif kind == "SpladePooling":
            conf = read_json(mpath / "config.json") or {}
            cfg.pooling_type = "SPLADE"
            cfg.splade = (conf.get("pooling_strategy", "max"),
                          conf.get("activation_function", "relu"))
        elif kind == "Normalize":
            cfg.normalize = True
    st = next((c for c in (read_json(path / name) for name in _ST_CONFIG_FILES) if c), {})
    cfg.max_seq_length = st.get("max_seq_length")
    cfg.do_lower_case = bool(st.get("do_lower_case", False))
    _read_prompts(path, cfg)
    return cfg


def _read_prompts(path: Path, cfg: SentenceTransformersConfig) -> None:
    conf = read_json(path / "config_sentence_transformers.json") or {}
    prompts = conf.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ValueError(f"'prompts' in {path}/config_sentence_transformers.json must map "
                         "names to prompt strings.")
    cfg.prompts = dict(prompts)
    default = conf.get("default_prompt_name")
    if default is not None and default not in cfg.prompts:
        raise ValueError(f"default_prompt_name {default!r} in {path}/"
                         "config_sentence_transformers.json is not one of its prompts "
                         f"({', '.join(cfg.prompts) or 'none'}).")
    cfg.default_prompt_name = default


# The Transformer module's settings file, named after the model family (the first found).
_ST_CONFIG_FILES = ("sentence_bert_config.json", "sentence_roberta_config.json",
                    "sentence_distilbert_config.json", "sentence_camembert_config.json",
                    "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                    "sentence_xlnet_config.json")


def _pooling_type(mpath: Path) -> Optional[str]:
    conf = read_json(mpath / "config.json") or {}
    if conf.get("pooling_mode"):  # newer single-field spelling
        mode = {"cls": "CLS", "mean": "MEAN", "lasttoken": "LAST"}.get(conf["pooling_mode"])
        if mode is None:
            raise ValueError(f"sentence-transformers pooling mode {conf['pooling_mode']!r} "
                             "is not supported (supported: cls, mean, lasttoken).")
        return mode
    for key in _UNSUPPORTED_MODES:
        if conf.get(key):
            raise ValueError(f"sentence-transformers pooling mode {key!r} in {mpath} is not "
                             "supported (supported: cls_token, mean_tokens, lasttoken).")
    for key, value in conf.items():
        if key in _POOLING_MODES and value:
            return _POOLING_MODES[key]
    return None


def _dense_spec(mpath: Path) -> DenseSpec:
    conf = read_json(mpath / "config.json")
    if conf is None:
        raise ValueError(f"sentence-transformers Dense module at {mpath} has no config.json")
    return DenseSpec(path=mpath, in_features=conf["in_features"],
                     out_features=conf["out_features"], bias=conf.get("bias", True),
                     activation=conf.get("activation_function",
                                         "torch.nn.modules.activation.Tanh"))
