"""Score templates: a Jinja chat template that turns a (query, document) pair into the one
prompt an LLM reranker scores (Qwen3-Reranker, mxbai-rerank-v2, bge-reranker-v2-gemma).

As in upstream vLLM 0.33, the pair reaches the template as two messages,
``[{"role": "query", "content": q}, {"role": "document", "content": d}]``, rendered with
the tokenizer's ``apply_chat_template(..., tokenize=False)``; the rendered text is then
tokenized like any prompt. A template comes from ``--chat-template`` / ``LLM(chat_template=)``
/ ``LLM.score(chat_template=)`` (a file path or the template itself), else from a
sentence-transformers CrossEncoder whose Transformer module takes ``message`` inputs (its
``processing_kwargs.chat_template`` names one of the tokenizer's templates and carries the
template's keyword arguments). The tokenizer's own chat template alone is not used: many
rerankers inherit a chat model's template that was never meant for scoring.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from vllm.transformers_utils.config import read_json

# Characters a template has and a file name has not: a value without any of them that
# cannot be opened was meant as a path, and is refused rather than scored as text.
_TEMPLATE_CHARS = ("{", "}", "\n")
# Keyword arguments the scorer fixes itself.
_RESERVED_KWARGS = frozenset({"chat_template", "tools", "tokenize", "conversation",
                              "messages"})
_ST_TRANSFORMER_TYPES = frozenset({"sentence_transformers.models.Transformer",
                                   "sentence_transformers.base.modules.transformer.Transformer"})


def load_score_template(value: Union[str, Path, None]) -> Optional[str]:
    """The template text of `value`: the contents of the file it names, else `value`
    itself when it reads as a template. A value that looks like a path but cannot be
    opened is a ValueError."""
    if value is None:
        return None
    if not isinstance(value, (str, Path)):
        raise ValueError(f"chat_template must be a file path or a template string, got "
                         f"{type(value).__name__}.")
    try:
        with open(value, encoding="utf-8") as f:
            return f.read()
    except (OSError, ValueError) as exc:
        if isinstance(value, Path) or not any(c in value for c in _TEMPLATE_CHARS):
            raise ValueError(f"The chat template {str(value)!r} looks like a file path, but "
                             f"it could not be opened ({exc}). Pass an existing file or "
                             "the Jinja template itself.") from exc
    return value


def check_template_kwargs(kwargs: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The extra template variables, refusing the names the scorer sets itself."""
    kwargs = dict(kwargs or {})
    reserved = sorted(_RESERVED_KWARGS & kwargs.keys())
    if reserved:
        raise ValueError(f"chat_template_kwargs may not set {reserved}: the scorer fixes "
                         "them.")
    return kwargs


def st_cross_encoder_template_kwargs(path: Path) -> Optional[dict[str, Any]]:
    """The saved ``processing_kwargs.chat_template`` of a sentence-transformers CrossEncoder
    whose single Transformer module takes ``message`` inputs ({} when it names no template
    settings); None for any other checkpoint."""
    st = read_json(path / "config_sentence_transformers.json")
    if not isinstance(st, dict) or st.get("model_type") != "CrossEncoder":
        return None
    modules = read_json(path / "modules.json")
    if isinstance(modules, dict):
        modules = modules.get("modules")
    transformer = read_json(path / "sentence_bert_config.json")
    if not (isinstance(modules, list) and len(modules) == 1 and isinstance(modules[0], dict)
            and modules[0].get("type") in _ST_TRANSFORMER_TYPES
            and not modules[0].get("path") and isinstance(transformer, dict)
            and transformer.get("transformer_task") == "sequence-classification"
            and isinstance(transformer.get("modality_config"), dict)
            and "message" in transformer["modality_config"]):
        return None
    processing = transformer.get("processing_kwargs") or {}
    saved = processing.get("chat_template") if isinstance(processing, dict) else None
    if not isinstance(saved or {}, dict):
        raise ValueError(f"{path}/sentence_bert_config.json: processing_kwargs.chat_template "
                         "must be a JSON object.")
    saved = dict(saved or {})
    saved.pop("restore_suffix", None)  # the engine never re-appends a cut suffix
    name = saved.get("chat_template")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"{path}/sentence_bert_config.json: the chat template name must be "
                         "a string.")
    bad = sorted({"tokenize", "tools"} & saved.keys())
    if bad:
        raise ValueError(f"{path}/sentence_bert_config.json: unsupported chat template "
                         f"settings {bad}.")
    return saved


def st_cross_encoder_template(path: Path, tokenizer: Any
                              ) -> Optional[tuple[str, dict[str, Any]]]:
    """(template, template kwargs) that a sentence-transformers CrossEncoder checkpoint
    declares, the template taken from its tokenizer by name (or the default one); None when
    the checkpoint declares none. A declared template the tokenizer lacks is a ValueError."""
    saved = st_cross_encoder_template_kwargs(path)
    if saved is None:
        return None
    name = saved.pop("chat_template", None)
    try:
        template = tokenizer.get_chat_template(name)
    except ValueError:
        template = None
    if not template or template == name:
        raise ValueError(f"{path} is a sentence-transformers CrossEncoder scored through its "
                         f"{name or 'default'!r} chat template, but its tokenizer has no such "
                         "template.")
    return template, saved


def render_score_prompt(tokenizer: Any, template: str, query: str, document: str,
                        kwargs: Optional[dict[str, Any]] = None) -> str:
    """The prompt text of one (query, document) pair through `template`."""
    messages = [{"role": "query", "content": query},
                {"role": "document", "content": document}]
    try:
        text = tokenizer.apply_chat_template(messages, chat_template=template,
                                             tokenize=False, **check_template_kwargs(kwargs))
    except ValueError:
        raise
    except Exception as exc:  # jinja2 errors: a broken or failing template
        raise ValueError(f"The score template failed to render: {exc}") from exc
    if not isinstance(text, str) or not text:
        raise ValueError("The score template rendered an empty prompt.")
    return text
