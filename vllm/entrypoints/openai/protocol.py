"""Request bodies of the OpenAI-compatible server (field names as vLLM's); the responses' are
responses.py's."""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr,
                      ValidationInfo, field_validator, model_validator)
from typing_extensions import Annotated

from vllm.engine.prompt_types import check_text


def _valid_text(value: str, info: ValidationInfo) -> str:
    return check_text(value, info.field_name or "input")


# Every text field of a request: a string that is valid Unicode. A lone UTF-16 surrogate
# ("\ud800" in JSON, or the raw bytes ED A0 80) is a 400 naming the field here, before it
# can reach a tokenizer (which raises a TypeError on it).
Text = Annotated[StrictStr, AfterValidator(_valid_text)]
# A single prompt, a batch of prompts, one token-id list or a batch of token-id lists.
PromptInput = Union[Text, list[Text], list[StrictInt], list[list[StrictInt]]]
# Truncation: -1 = max_model_len, k >= 1 = keep k tokens (checked against the model later).
# Scalar numbers and flags validate in pydantic's lax mode, as upstream's plain `int` / `bool`
# fields do ("5" -> 5, "false" -> False); texts and token lists stay strict.
TruncateTokens = Optional[int]
# Which end a truncation cuts: None = the server's --truncation-side (default "right").
TruncationSide = Optional[Literal["left", "right"]]
# Upstream's `padding`: "max_length" pads each prompt to max_model_len (vllm.engine.padding).
Padding = Optional[Literal["max_length", "do_not_pad"]]


# Request fields upstream vLLM acts on that this server does not implement (yet): each is a
# 400 naming it rather than silently ignored. A field that gets implemented is declared on
# its request model and so is no longer an "extra" that reaches this check.
UNSUPPORTED_UPSTREAM_FIELDS = frozenset({
    "messages", "chat_template", "chat_template_kwargs",
    "add_generation_prompt", "continue_final_message", "mm_processor_kwargs", "embed_dtype",
    "endianness", "max_tokens_per_doc", "max_tokens_per_query",
    "return_token_ids", "tools", "lora_request", "padding"})


class UnsupportedFieldError(ValueError):
    def __init__(self, field: str) -> None:
        super().__init__(f"`{field}` is not supported by this server; remove it from the "
                         "request.")
        self.field = field


class FieldError(ValueError):
    """A request error that names its field (the 400's `param`)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class OpenAIBaseModel(BaseModel):
    """Unknown request fields are accepted and ignored, as OpenAI clients send extras."""

    model_config = ConfigDict(extra="allow")


# ----- requests -------------------------------------------------------------------------
class EngineRequest(OpenAIBaseModel):
    """A request that runs on the engine. `priority` is upstream's field: the scheduler here
    is first-come-first-served, so any value but 0 is refused, as upstream refuses it
    without `--scheduling-policy priority`."""

    priority: int = 0
    request_id: Optional[Text] = None  # upstream's: the response id's suffix
    cache_salt: Optional[Any] = None  # upstream's: separates this client's cached prefixes

    @field_validator("cache_salt")
    @classmethod
    def _salt(cls, value: Any) -> Optional[str]:
        """Upstream's rule: a non-empty string of at most 128 characters, none of them
        '@', '/', '\\' or NUL (the salt enters block hashes, and logs)."""
        if value is None:
            return value
        if not isinstance(value, str) or not value:
            raise ValueError("Parameter 'cache_salt' must be a non-empty string if provided.")
        if len(value) > 128 or any(c in value for c in "@/\\\0"):
            raise ValueError("Parameter 'cache_salt' must be at most 128 characters and must "
                             "not contain '@', '/', '\\\\', or NUL.")
        return value

    @field_validator("priority")
    @classmethod
    def _fcfs_only(cls, value: int) -> int:
        if value != 0:
            raise ValueError(f"Got priority {value} but Priority scheduling is not enabled.")
        return value

    @model_validator(mode="after")
    def _no_ignored_upstream_fields(self) -> "EngineRequest":
        """Unknown fields are ignored, but one that upstream vLLM acts on is refused by name:
        ignoring it would return an answer the client did not ask for."""
        given = sorted(UNSUPPORTED_UPSTREAM_FIELDS.intersection(self.model_extra or ()))
        if given:
            raise UnsupportedFieldError(given[0])
        return self


class LateChunkingConfig(BaseModel):
    """`late_chunking_params` (upstream 0.33): {"chunk_size": N}, N a positive integer."""

    model_config = ConfigDict(extra="forbid")

    chunk_size: int = Field(gt=0, le=2**63 - 1, strict=True)


class EmbeddingRequest(EngineRequest):
    """`input`, or upstream's chat-style `messages` (text and image_url content parts:
    one prompt, for multimodal models)."""

    model: Optional[Text] = None
    input: Optional[PromptInput] = None
    messages: Optional[list[Any]] = None
    add_generation_prompt: bool = False  # with `messages` on a vision-language model
    encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = "float"
    embed_dtype: Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"
    dimensions: Optional[int] = None
    user: Optional[Text] = None
    truncate_prompt_tokens: TruncateTokens = None
    truncation_side: TruncationSide = None
    padding: Padding = None
    add_special_tokens: bool = True
    normalize: Optional[bool] = None
    use_activation: Optional[bool] = None
    # sentence-transformers' quantization (`quantize_embeddings`) and its int8 ranges
    precision: Optional[Literal["float32", "int8", "uint8", "binary", "ubinary"]] = None
    ranges: Optional[list[list[float]]] = None
    # sentence-transformers / TEI prompts: a named prompt of the model, or a raw prefix
    prompt_name: Optional[Text] = None
    prompt: Optional[Text] = None
    # SPLADE models: {token_id: weight} of the non-zero weights instead of the full vector.
    sparse: bool = False
    # token_embed engines: one mean vector per chunk of N tokens (upstream 0.33)
    late_chunking_params: Optional[LateChunkingConfig] = None

    @model_validator(mode="after")
    def _input_or_messages(self) -> "EmbeddingRequest":
        if self.input is None and self.messages is None:
            raise FieldError("Field required: `input` (or chat-style `messages`).", "input")
        if self.input is not None and self.messages is not None:
            raise FieldError("Give either `input` or `messages`, not both.", "messages")
        return self


class CohereEmbedRequest(EngineRequest):
    """Cohere's `/v2/embed` (as upstream serves it): `texts` only here (images are 400s)."""

    model: Optional[Text] = None
    texts: Optional[list[Text]] = None
    input_type: Optional[Text] = None        # one of the model's prompts (ST `prompts`)
    embedding_types: Optional[list[Literal["float", "binary", "ubinary", "base64"]]] = None
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: Optional[int] = None
    output_dimension: Optional[int] = None   # Matryoshka models only


class PoolingRequest(EmbeddingRequest):
    """`/pooling`: the same fields as embeddings; the raw pooler output comes back."""

    softmax: Optional[bool] = None
    task: Optional[Text] = None  # upstream's: which pooling task runs (default: the model's)


class ClassificationRequest(EngineRequest):
    model: Optional[Text] = None
    input: PromptInput
    user: Optional[Text] = None
    truncate_prompt_tokens: TruncateTokens = None
    truncation_side: TruncationSide = None
    padding: Padding = None
    add_special_tokens: bool = True
    activation: Optional[bool] = None
    use_activation: Optional[bool] = None


def _aliased(data: Any, names: dict[str, tuple[str, ...]]) -> Any:
    """`data` with each canonical field filled from its first alias present (upstream's
    newer spellings); a canonical field and an alias together are refused."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for canonical, aliases in names.items():
        given = [a for a in aliases if a in data]
        if canonical in data and given:
            raise ValueError(f"Give either `{canonical}` or `{given[0]}`, not both.")
        if given:
            data[canonical] = data.pop(given[0])
    return data


class LongInputFields(EngineRequest):
    """Truncation of a score/rerank request: the whole pair (`truncate_prompt_tokens`), or
    each side's own text (Cohere's `max_tokens_per_query` / `max_tokens_per_doc`, 0 = no
    cap), cut at `truncation_side`."""

    truncate_prompt_tokens: TruncateTokens = None
    truncation_side: TruncationSide = None
    max_tokens_per_query: int = 0
    max_tokens_per_doc: int = 0
    # Variables for the score template (upstream 0.33): `instruction` is short for
    # chat_template_kwargs={"instruction": ...}; a key inside chat_template_kwargs wins.
    instruction: Optional[Text] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None

    def template_kwargs(self) -> Optional[dict[str, Any]]:
        """The score template's extra variables of this request (None: none)."""
        if self.instruction is None:
            return self.chat_template_kwargs
        return {"instruction": self.instruction, **(self.chat_template_kwargs or {})}


# A score/rerank item: a text, or upstream's multimodal `{"content": [parts]}`.
ScoreItem = Union[Text, dict[str, Any]]


class ScoreRequest(LongInputFields):
    """`text_1`/`text_2`, or upstream's newer spellings: `queries` with `documents` or
    `items`, and `data_1`/`data_2`."""

    model: Optional[Text] = None
    text_1: Union[ScoreItem, list[ScoreItem]]
    text_2: Union[ScoreItem, list[ScoreItem]]

    @model_validator(mode="before")
    @classmethod
    def _spellings(cls, data: Any) -> Any:
        return _aliased(data, {"text_1": ("queries", "data_1"),
                               "text_2": ("documents", "items", "data_2")})
    activation: Optional[bool] = None
    use_activation: Optional[bool] = None


class RerankRequest(LongInputFields):
    """`query`/`documents`, also spelled as on /score (`queries`/`items`, `data_1`/`data_2`,
    `text_1`/`text_2`)."""

    model: Optional[Text] = None
    query: ScoreItem
    documents: list[ScoreItem]

    @model_validator(mode="before")
    @classmethod
    def _spellings(cls, data: Any) -> Any:
        return _aliased(data, {"query": ("queries", "data_1", "text_1"),
                               "documents": ("items", "data_2", "text_2")})
    top_n: int = 0  # 0, negative or more than the documents: all of them
    return_documents: bool = True
    # Score a long document by windows (the best one's score), at most this many; None = the
    # server's --rerank-max-chunks-per-doc (default 0: off, a too-long pair stays a 400).
    max_chunks_per_doc: Optional[int] = None
    activation: Optional[bool] = None
    use_activation: Optional[bool] = None


class TokenizeRequest(OpenAIBaseModel):
    model: Optional[Text] = None
    prompt: Text
    add_special_tokens: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(OpenAIBaseModel):
    model: Optional[Text] = None
    tokens: list[StrictInt]
