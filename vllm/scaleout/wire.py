"""What crosses between the front and a replica: plain picklable tuples.

Tensors travel as numpy arrays: pickling a torch tensor through multiprocessing would move
it into shared memory and pass a file descriptor per output, far dearer than its bytes.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

import torch

from vllm.engine.async_llm import EngineDeadError
from vllm.outputs import PoolingOutput, PoolingRequestOutput

# (request_id, kind, payload): kind "ok" -> (data, prompt_token_ids, num_cached_tokens);
# "error" -> (exception class name, message).
Result = tuple[str, str, Any]


def pack_output(request_id: str, out: PoolingRequestOutput) -> Result:
    return (request_id, "ok", (out.outputs.data.numpy(), out.prompt_token_ids,
                               out.num_cached_tokens))


def pack_error(request_id: str, exc: BaseException) -> Result:
    return (request_id, "error", (type(exc).__name__, str(exc)))


def pack_future(request_id: str, future: "asyncio.Future") -> Optional[Result]:
    """A finished replica-side future as a result; None when it was cancelled (aborted)."""
    if future.cancelled():
        return None
    exc = future.exception()
    return pack_error(request_id, exc) if exc is not None else \
        pack_output(request_id, future.result())


def unpack(result: Result) -> tuple[Any, Optional[BaseException]]:
    """(PoolingRequestOutput, None) or (None, the exception to raise to the caller)."""
    request_id, kind, payload = result
    if kind == "ok":
        data, token_ids, cached = payload
        if not data.flags.writeable:  # Ray hands back read-only (zero-copy) arrays
            data = data.copy()
        return PoolingRequestOutput(request_id, PoolingOutput(torch.from_numpy(data)),
                                    token_ids, True, cached), None
    name, message = payload
    if name == "ValueError":
        return None, ValueError(message)
    if name == "EngineDeadError":
        return None, EngineDeadError(message)
    return None, RuntimeError(f"{name}: {message}")
