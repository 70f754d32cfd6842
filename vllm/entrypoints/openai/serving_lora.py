"""LoRA adapters behind the server: the names clients may put in `model`, their
/v1/models cards, and (with VLLM_ALLOW_RUNTIME_LORA_UPDATING) upstream's runtime
`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`.

A name maps to a `LoRARequest` with an id of its own; the engine loads the adapter on its
first request (on the engine thread). Loading through the route checks the adapter
first, off the event loop, so a bad one is answered at once and never served.
"""
from __future__ import annotations

import asyncio
import itertools
from typing import Any, Optional

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel

from vllm.entrypoints.openai.errors import APIError
from vllm.entrypoints.openai.lora_args import LoRAModulePath
from vllm.logger import init_logger
from vllm.lora.peft_config import AdapterNotFoundError
from vllm.lora.request import LoRARequest
from vllm.platforms.helper_threads import serial_torch, serial_torch_here

logger = init_logger(__name__)


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: Optional[int] = None


class LoRARegistry:
    """Served adapter name -> LoRARequest (ids from 1, kept by a name across reloads)."""

    def __init__(self, base_names: list[str]) -> None:
        self.base_names = base_names
        self.adapters: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)

    def get(self, name: Optional[str]) -> Optional[LoRARequest]:
        return self.adapters.get(name) if name else None

    def load(self, engine: Any, name: str, path: str, load_inplace: bool = False,
             base_model_name: Optional[str] = None) -> LoRARequest:
        """Check the adapter with the engine and serve it under `name`; APIError for a
        name that is taken (400) or an adapter the engine refuses (see `check`)."""
        request = self.prepare(name, path, load_inplace, base_model_name)
        check(engine, request)
        return self.commit(request)

    def prepare(self, name: str, path: str, load_inplace: bool = False,
                base_model_name: Optional[str] = None) -> LoRARequest:
        """The LoRARequest `name` would be served as (400 for a missing field or a name
        that is taken)."""
        if not name or not path:
            raise APIError(400, "Both 'lora_name' and 'lora_path' must be provided.")
        if name in self.base_names:
            raise APIError(400, f"The lora adapter '{name}' conflicts with a served base "
                           "model.")
        old = self.adapters.get(name)
        if old is not None and not load_inplace:
            raise APIError(400, f"The lora adapter '{name}' has already been loaded. To "
                           "load it again in place, set 'load_inplace' to true.")
        return LoRARequest(name, old.lora_int_id if old else next(self._ids), path,
                           base_model_name, load_inplace=old is not None)

    def commit(self, request: LoRARequest) -> LoRARequest:
        self.adapters[request.lora_name] = request
        logger.info("Serving LoRA adapter %r (id %d) from %s", request.lora_name,
                    request.lora_int_id, request.lora_path)
        return request

    def unload(self, name: str) -> None:
        """Stop serving `name` (404 when it is not served)."""
        if not name:
            raise APIError(400, "'lora_name' needs to be provided to unload a LoRA adapter.")
        if self.adapters.pop(name, None) is None:
            raise APIError(404, f"The lora adapter '{name}' cannot be found.")
        logger.info("Stopped serving LoRA adapter %r", name)

    def cards(self) -> list[tuple[str, str, str]]:
        """(name, root, parent) of every served adapter, in load order."""
        return [(name, r.lora_path, r.base_model_name or self.base_names[0])
                for name, r in self.adapters.items()]


def check(engine: Any, request: LoRARequest) -> None:
    """The engine's checks of an adapter, answered as upstream answers a failed load: 404
    when the directory holds no adapter, else 500 with the engine's reason. Its torch
    ops start no OpenMP team beside the engine's, and the calling thread keeps its own
    thread count."""
    try:
        with serial_torch():
            engine.check_lora(request)
    except AdapterNotFoundError as exc:
        raise APIError(404, f"Loading lora {request.lora_name} failed: No adapter found "
                       f"for {request.lora_path}") from exc
    except (ValueError, OSError) as exc:
        raise APIError(500, str(exc)) from exc


def _check_on_helper(engine: Any, request: LoRARequest) -> None:
    serial_torch_here()  # the loop's worker thread: serial for good, as every helper
    check(engine, request)


def load_static(registry: LoRARegistry, engine: Any, modules: list[LoRAModulePath]) -> None:
    """The `--lora-modules` adapters, checked at start-up (a bad one stops the server)."""
    for m in modules:
        try:
            registry.load(engine, m.name, m.path, base_model_name=m.base_model_name)
        except APIError as exc:
            raise ValueError(f"--lora-modules {m.name}={m.path}: {exc.message}") from None


def make_router(registry: LoRARegistry, engine: Any) -> APIRouter:
    """The runtime load/unload routes (include only when runtime updating is allowed)."""
    router = APIRouter()

    @router.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> Any:
        request = registry.prepare(body.lora_name, body.lora_path, body.load_inplace)
        await asyncio.to_thread(_check_on_helper, engine, request)
        registry.commit(request)
        return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.",
                        status_code=200)

    @router.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> Any:
        registry.unload(body.lora_name)
        return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.",
                        status_code=200)

    return router
