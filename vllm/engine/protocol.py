"""What a request front may ask of an engine: `EngineClient`, one protocol that `AsyncLLM`
(one engine on a thread) and `vllm.scaleout.DPAsyncLLM` (replicas behind a router) both
implement, so the server types its engine and never probes it with getattr/hasattr.

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
