"""What a request front may ask of an engine, in two protocols.

`EngineCore` is the synchronous engine that computes: `LLMEngine` implements it, the
offline `LLM` submits to it and steps it, and `AsyncLLM` drives one on its thread.
`EngineClient` is the asynchronous front of one: `AsyncLLM` (one engine on a thread) and
`vllm.scaleout.DPAsyncLLM` (replicas behind a router) both implement it, so the server types
its engine and never probes it with getattr/hasattr. Both fronts build the same
`PoolingRequest` and prepare it with vllm.engine.request_front before submitting.

The parts one kind has and the other lacks are members of both with a plain answer:
`health_report()` is None on one engine, `refresh_stats()` a no-op there, and
`supports_lora` says whether `check_lora` can succeed. `stats` is one engine's
`EngineStats`, or per replica label a mapping of them (`replica_stats()` gives that mapping
for both).
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, Union, \
    runtime_checkable

from vllm.engine.stats import EngineStats


@runtime_checkable
class EngineCore(Protocol):
    model_config: Any
    processor: Any           # the InputProcessor that tokenizes for this engine

    @property
    def stats(self) -> EngineStats: ...

    def verify_task(self, task: str) -> None:
        """ValueError when the model does not serve `task` (naming what it serves)."""
        ...

    def add_request(self, request_id: str, prompt: Any, params: Any,
                    lora_request: Any = None) -> None:
        """Queue one tokenized prompt; ValueError for what the engine refuses."""
        ...

    def abort_request(self, request_ids: list[str]) -> None: ...

    def has_unfinished_requests(self) -> bool: ...

    def step(self) -> list[Any]:
        """Run one step; the `PoolingRequestOutput`s of the requests it finished."""
        ...

    def reset_stats(self) -> None: ...

    def reset_prefix_cache(self) -> None: ...


@runtime_checkable
class EngineClient(Protocol):
    model_config: Any
    processor: Any           # the tokenizer thread's InputProcessor
    supports_lora: bool

    @property
    def is_alive(self) -> bool: ...

    @property
    def errored(self) -> bool: ...

    @property
    def dead_error(self) -> BaseException: ...

    @property
    def num_pending(self) -> int: ...

    @property
    def stats(self) -> Union[EngineStats, Mapping[str, EngineStats]]: ...

    def replica_stats(self) -> Mapping[str, EngineStats]:
        """The counters by replica label ({} for a single engine)."""
        ...

    def health_report(self) -> Optional[dict[str, Any]]:
        """/health's JSON body (None: a plain 200)."""
        ...

    async def refresh_stats(self) -> None:
        """Fetch the counters /metrics shows (a no-op where they are local)."""
        ...

    def on_dead(self, callback: Callable[[], None]) -> None: ...

    def submit_many(self, items: Sequence[tuple[Any, Any, str]],
                    **kwargs: Any) -> list[asyncio.Future]: ...

    def check_lora(self, lora_request: Any) -> None: ...

    def abort(self, request_ids: Sequence[str]) -> None: ...

    def shutdown(self, timeout: float = 30.0) -> None: ...

    async def run_in_tokenizer_thread(self, fn: Callable[..., Any], *args: Any) -> Any: ...

    async def tokenize_request(self, request: Any) -> list[Any]:
        """A PoolingRequest's prompts tokenized on the tokenizer thread
        (vllm.engine.request_front)."""
        ...

    async def tokenize_prompts(self, prompts: Sequence[Any], *args: Any,
                               **kwargs: Any) -> list[Any]: ...
