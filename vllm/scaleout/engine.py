"""Pick the serving engine the flags ask for: one AsyncLLM, or N replicas behind a router."""
from __future__ import annotations

from typing import Any

from vllm.engine.async_llm import AsyncLLM


def make_async_engine(engine_args: Any, args: Any = None) -> Any:
    """`AsyncLLM` for one replica; a `DPAsyncLLM` (same interface) for
    `--data-parallel-size N` > 1 or the Ray backend."""
    size = int(getattr(args, "data_parallel_size", 1) or 1)
    backend = getattr(args, "data_parallel_backend", "mp") or "mp"
    if size <= 1 and backend == "mp":
        return AsyncLLM.from_engine_args(engine_args)
    from vllm.scaleout.dp_engine import DPAsyncLLM
    return DPAsyncLLM.start(engine_args, size, backend, args)
