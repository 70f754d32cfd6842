"""How much one request, and the server as a whole, may take on (`vllm serve` flags).

An overloaded server answers at once (503 with Retry-After) instead of queueing without
bound, and a single request's size is capped (400 naming the limit), so one client cannot
hold the engine for minutes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from vllm.entrypoints.openai.errors import APIError, bad_request

# Prompts waiting in (or running on) the engine before new requests get 503. Measured
# here: MiniLM serves ~140 texts/s on 2 cores, so 4096 waiting prompts is ~30 s of queue,
# the longest a client's default HTTP timeout commonly allows.
DEFAULT_MAX_WAITING_REQUESTS = 4096
DEFAULT_MAX_INPUTS_PER_REQUEST = 16384
DEFAULT_MAX_TOKENS_PER_REQUEST = 2 ** 21   # ~2M tokens: ~2.5 min of MiniLM work here
# At most this many special tokens a tokenizer adds to one text (bound used before the
# text is tokenized).
_SPECIALS_PER_TEXT = 8


@dataclass(frozen=True)
class ServingLimits:
    max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS
    max_inputs_per_request: int = DEFAULT_MAX_INPUTS_PER_REQUEST
    max_tokens_per_request: int = DEFAULT_MAX_TOKENS_PER_REQUEST

    @classmethod
    def from_args(cls, args: Any) -> "ServingLimits":
        """From `vllm serve` flags (missing or None ones keep their defaults)."""
        given = {name: getattr(args, name, None) for name in cls.__dataclass_fields__}
        return cls(**{k: int(v) for k, v in given.items() if v is not None})

    def check_inputs(self, count: int, param: Optional[str]) -> None:
        if count > self.max_inputs_per_request:
            raise bad_request(f"The request has {count} inputs; this server takes at most "
                              f"{self.max_inputs_per_request} per request "
                              "(--max-inputs-per-request). Split it.", param)

    def texts_surely_fit(self, texts: Sequence[str]) -> bool:
        """Whether these texts stay under the token cap whatever the tokenizer does (a token
        covers at least one UTF-8 byte, plus a few special tokens per text)."""
        bound = sum(len(t) if t.isascii() else 4 * len(t) for t in texts)
        return bound + _SPECIALS_PER_TEXT * len(texts) <= self.max_tokens_per_request

    def check_tokens(self, prompts: Sequence[Any], param: Optional[str]) -> None:
        total = sum(len(p.prompt_token_ids) for p in prompts)
        if total > self.max_tokens_per_request:
            raise bad_request(f"The request has {total} tokens in all; this server takes at "
                              f"most {self.max_tokens_per_request} per request "
                              "(--max-tokens-per-request). Split it.", param)

    def check_room(self, waiting: int, count: int) -> None:
        """503 with Retry-After when `count` more prompts would overfill the queue; an idle
        server always takes one request (up to the per-request caps)."""
        if waiting and waiting + count > self.max_waiting_requests:
            raise APIError(503, f"The server is overloaded: {waiting} prompts are waiting "
                           f"(--max-waiting-requests {self.max_waiting_requests}); retry "
                           "shortly.", headers={"Retry-After": "1"})
