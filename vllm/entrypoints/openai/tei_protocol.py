"""Hugging Face text-embeddings-inference (TEI) 1.x wire format: request models, the error
body `{"error", "error_type"}` and the status each error type answers with.

Field names, types and defaults follow TEI's public HTTP API (its router's request types);
the models are this project's own. `truncate` left unset means TEI's `--auto-truncate`,
which this server reports as on (`/info`): the input is cut to the model's length.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, StrictInt, field_validator

from vllm.entrypoints.openai.protocol import Text

# TEI's error types and the HTTP status each one is answered with. A validation error (a
# too-long input with `truncate: false`, a batch over --max-client-batch-size) is 422, as
# the TEI 1.9 contract this server follows says; older TEI routers answered it with 413.
ERROR_STATUS: dict[str, int] = {
    "Unhealthy": 503,
    "Backend": 424,
    "Overloaded": 429,
    "Tokenizer": 422,
    "Validation": 422,
    "Empty": 400,
}

# TEI's default --max-client-batch-size.
DEFAULT_MAX_CLIENT_BATCH_SIZE = 32


class TeiError(Exception):
    """A refusal in TEI's terms; `status` defaults to the type's own."""

    def __init__(self, error_type: str, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.status = status if status is not None else ERROR_STATUS[error_type]
        self.headers: Optional[dict[str, str]] = None

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}


Direction = Literal["Left", "Right"]


class _TeiRequest(BaseModel):
    """Unknown fields are ignored, as TEI's request types ignore them."""

    model_config = ConfigDict(extra="ignore")


class _Truncation(_TeiRequest):
    truncate: Optional[bool] = None
    truncation_direction: Direction = "Right"

    @field_validator("truncation_direction", mode="before")
    @classmethod
    def _direction(cls, value: Any) -> Any:
        """TEI's enum is `Left` / `Right`; its documentation shows them lower-case."""
        return value.capitalize() if isinstance(value, str) else value


# One embed input: a text, or token ids (TEI's InputType).
EmbedItem = Union[Text, list[StrictInt]]


class EmbedRequest(_Truncation):
    inputs: Union[EmbedItem, list[EmbedItem]]
    prompt_name: Optional[Text] = None
    normalize: bool = True
    dimensions: Optional[StrictInt] = None


class EmbedAllRequest(_Truncation):
    inputs: Union[EmbedItem, list[EmbedItem]]
    prompt_name: Optional[Text] = None


class EmbedSparseRequest(EmbedAllRequest):
    pass


class PredictRequest(_Truncation):
    """`inputs`: a text, a pair [a, b], or a batch of [text] / [a, b] items."""

    inputs: Union[Text, list[Text], list[list[Text]]]
    raw_scores: bool = False

    @field_validator("inputs")
    @classmethod
    def _shape(cls, value: Any) -> Any:
        if isinstance(value, list) and value and isinstance(value[0], str) and len(value) > 2:
            raise ValueError("a single input is a string or a pair [string, string]")
        if isinstance(value, list) and value and isinstance(value[0], list):
            if any(len(item) not in (1, 2) for item in value):
                raise ValueError("each batch item is [string] or a pair [string, string]")
        return value


class RerankRequest(_Truncation):
    query: Text
    texts: list[Text]
    raw_scores: bool = False
    return_text: bool = False


class SimilarityInput(_TeiRequest):
    source_sentence: Text
    sentences: list[Text]


class SimilarityParameters(_Truncation):
    prompt_name: Optional[Text] = None


class SimilarityRequest(_TeiRequest):
    inputs: SimilarityInput
    parameters: Optional[SimilarityParameters] = None


class TokenizeRequest(_TeiRequest):
    inputs: Union[Text, list[Text]]
    add_special_tokens: bool = True
    prompt_name: Optional[Text] = None


class DecodeRequest(_TeiRequest):
    ids: Union[list[StrictInt], list[list[StrictInt]]]
    skip_special_tokens: bool = True


def is_tei_body(path: str, body: Any) -> bool:
    """Whether a body sent to a path both APIs serve (/rerank, /tokenize, /invocations)
    is TEI's: TEI's fields present and vLLM's absent."""
    if not isinstance(body, dict):
        return False
    if path == "/rerank":
        return "texts" in body and "documents" not in body
    if path == "/tokenize":
        return "inputs" in body and "prompt" not in body
    if path == "/invocations":
        return ("inputs" in body and "input" not in body) or \
            ("texts" in body and "query" in body and "documents" not in body)
    return True
