"""What every route family shares: the engine handle, model-name checks, route gating,
request ids, input normalisation, and running a batch of prompts with abort-on-disconnect."""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import random
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from fastapi import Depends, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from vllm.engine.async_llm import EngineDeadError
from vllm.engine import request_front
from vllm.engine.pooling_request import PoolingRequest
from vllm.engine.prompt_types import TextPrompt
from vllm.engine.protocol import EngineClient
from vllm.entrypoints.openai.direct_routes import DirectRoutes, post_route
from vllm.entrypoints.openai.errors import (APIError, ClientDisconnected, bad_request,
                                           engine_dead, internal_error, json_bytes)
from vllm.entrypoints.openai.serving_limits import ServingLimits
from vllm.platforms.helper_threads import serial_torch_here
from vllm.pooling_params import PoolingParams
from vllm.tasks import POOLING_ROUTES, route_tasks

# Which engine task each pooling route needs (vllm.tasks); the other routes work for every
# model.
ROUTE_TASKS: dict[str, tuple[str, ...]] = {route: route_tasks(route) for route in POOLING_ROUTES}
COMMON_ROUTES = ("POST /tokenize", "POST /detokenize", "POST /invocations", "GET /v1/models",
                 "GET /health", "GET /version", "GET /metrics")


def random_hex() -> str:
    """32 random hex digits, as uuid4().hex, from Python's generator (see `response_id`)."""
    return f"{random.getrandbits(128):032x}"


def json_response(body: BaseModel) -> Response:
    """A response model as JSON through orjson (`json_bytes`), as upstream: model_dump then
    orjson was 20-33% faster than pydantic's model_dump_json on embedding responses (1 to
    256 vectors of 384 to 4096 floats; ~1 us slower on a small score or tokenize body), with
    the same JSON (floats as numbers, NaN as null; only an exponent is spelt 1e20, not
    1e+20)."""
    return Response(json_bytes(body), media_type="application/json")


# A list response with more items than this is streamed one item at a time, each built
# only when it is sent, so a 10k-input request's ~80 MB of JSON is never held whole.
STREAM_MIN_ITEMS = 256


def streamed_list_response(shell: BaseModel, items: Iterator[BaseModel]) -> Response:
    """`shell` (a list response whose `data` is empty) with `items` as its data, sent
    as the same JSON `json_response` would send for the full model."""
    head = shell.model_dump_json()
    assert head.endswith('"data":[]}'), "the list response must end with its data"
    head = head[:-2]

    def chunks() -> Iterator[bytes]:  # resumed on any of AnyIO's worker threads
        serial_torch_here()
        yield head.encode()
        serial_torch_here()
        for i, item in enumerate(items):  # an item is built (tensors cast) as it is taken
            yield (("," if i else "") + item.model_dump_json()).encode()
            serial_torch_here()
        yield b"]}"
    return StreamingResponse(chunks(), media_type="application/json")


def list_response(shell: BaseModel, items: Iterable[BaseModel], count: int) -> Response:
    """`shell` (a list response with empty `data`) answered with `items` as its data:
    streamed past STREAM_MIN_ITEMS items, else one JSON body. Same bytes either way."""
    if count > STREAM_MIN_ITEMS:
        return streamed_list_response(shell, iter(items))
    return json_response(shell.model_copy(update={"data": list(items)}))


class ServingContext:
    """The state every serving module reads: the engine and the names it is served under."""

    def __init__(self, engine: Optional[EngineClient], served_model_names: Sequence[str],
                 metrics: Any = None, limits: ServingLimits = ServingLimits()) -> None:
        self._engine = engine
        self.served_model_names = list(served_model_names)
        self.metrics = metrics
        self.limits = limits
        self._request_counter = itertools.count()
        self.loras: Any = None  # serving_lora.LoRARegistry under --enable-lora
        self.direct = DirectRoutes(self.task_for)  # pooling routes past FastAPI's router

    # ----- engine and model -------------------------------------------------------------
    @property
    def engine(self) -> EngineClient:
        """The engine client (AsyncLLM or DPAsyncLLM); a 503 while it is not ready, a 500
        (upstream's message) once it is dead."""
        engine = self._engine
        if engine is None:
            raise APIError(503, "The engine is not ready yet; retry shortly.")
        if not engine.is_alive:
            raise engine_dead(engine.dead_error)
        return engine

    @property
    def model_config(self) -> Any:
        return self.engine.model_config

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, name: Optional[str]) -> str:
        """The model name to answer with; 404 when the client asked for another model."""
        return self.resolve_model(name)[0]

    def resolve_model(self, name: Optional[str]) -> tuple[str, Any]:
        """(the model name to answer with, the LoRA adapter it names or None); 404 when the
        client asked for a model this server does not serve."""
        adapter = self.loras.get(name) if self.loras is not None else None
        if name is None or name == "" or name in self.served_model_names or adapter:
            return name or self.model_name, adapter
        names = self.served_model_names + (list(self.loras.adapters) if self.loras else [])
        raise APIError(404, f"The model `{name}` does not exist. This server serves: "
                       f"{', '.join(names)}.", "model")

    def served_routes(self) -> list[str]:
        tasks = set(self.model_config.supported_tasks)
        pooling = [f"POST {route}" for route, needs in ROUTE_TASKS.items()
                   if tasks.intersection(needs)]
        return pooling + list(COMMON_ROUTES)

    def task_for(self, route: str) -> str:
        """The engine task that serves `route`, or a 404 naming the routes that work."""
        supported = self.model_config.supported_tasks
        for task in ROUTE_TASKS[route]:
            if task in supported:
                return task
        raise APIError(
            404, f"The model `{self.model_name}` cannot serve {route} (it needs the "
            f"{' or '.join(ROUTE_TASKS[route])} task; the model supports "
            f"{', '.join(supported)}). The routes this model serves: "
            f"{', '.join(self.served_routes())}.")

    def check_task(self, task: str, param: str = "task") -> str:
        """`task` when the model runs it, else a 400 naming the tasks it runs."""
        supported = list(self.model_config.supported_tasks)
        if task == "plugin":  # upstream's IOProcessor plugins: none exist here
            raise bad_request("No IOProcessor plugin installed. Please refer to the "
                              "documentation and to the 'prithvi_geospatial_mae_io_processor' "
                              "offline inference example for more details.", param)
        if task in supported:
            return task
        if task in self.model_config.pooling_tasks:  # the model has it, the engine runs another
            raise bad_request("Try switching the model's pooling_task via "
                              f"--pooler-config.task {task}.", param)
        raise bad_request(f"Unsupported task: {task!r} Supported tasks: "  # upstream's
                          f"{tuple(self.model_config.pooling_tasks)}", param)

    def route_error(self, path: str) -> Optional[str]:
        """Why the served model cannot serve the pooling route `path` (the body of a 404
        answered before the request body is read), or None."""
        if path not in ROUTE_TASKS or self._engine is None or not self._engine.is_alive:
            return None
        try:
            self.task_for(path)
        except APIError as exc:
            return exc.message
        return None

    def post(self, router: Any, path: str, model: type, handler: Any) -> None:
        """Serve POST `path` with `handler(body: model, request)`, behind the route guard:
        on FastAPI and directly (direct_routes.py)."""
        post_route(router, self.direct, path, model, handler, [self.route_guard(path)])

    def route_guard(self, route: str) -> Any:
        """A dependency that answers 503/404 before the body is validated (async, so
        FastAPI runs it on the event loop rather than hopping to a worker thread)."""
        async def guard() -> str:
            return self.task_for(route)
        return Depends(guard)

    def make_params(self, task: str, **fields: Any) -> PoolingParams:
        """PoolingParams for `task`, verified now (once: the engine takes them as they are)
        so that a bad parameter is a 400 up front."""
        try:
            return request_front.verified(
                PoolingParams(**{k: v for k, v in fields.items() if v is not None}), task,
                self.model_config)
        except ValueError as exc:
            wrong = [k for k, v in fields.items() if v is not None and k in str(exc)]
            raise bad_request(str(exc), wrong[0] if wrong else None) from exc

    # ----- ids ------------------------------------------------------------------------
    @staticmethod
    def response_id(request: Request, prefix: str, body: Any = None) -> str:
        """`prefix-<id>` with the body's `request_id` or the X-Request-Id header when the
        client sent one, else `prefix-<32 random hex>` (as uuid4().hex, but from Python's
        generator: os.urandom released the GIL, and the event loop then waited ~0.3 ms per
        request to get it back from the engine thread)."""
        given = getattr(body, "request_id", None) or request.headers.get("x-request-id")
        return f"{prefix}-{given or random_hex()}"

    # ----- inputs ---------------------------------------------------------------------
    def check_truncation(self, truncate: Optional[int],
                         side: Optional[str] = None) -> Optional[int]:
        """The engine processor's check (the one place truncation is validated), as a 400
        naming the field."""
        processor = self.engine.processor
        try:
            processor.check_side(side)
        except ValueError as exc:
            raise bad_request(str(exc), "truncation_side") from exc
        try:
            return processor.check_truncation(truncate)
        except ValueError as exc:
            raise bad_request(str(exc), "truncate_prompt_tokens") from exc

    @staticmethod
    def input_prompts(value: Union[str, list], param: str = "input") -> list[Any]:
        """A str, [str], [int] or [[int]] as a list of engine prompts."""
        if isinstance(value, str):
            return [value]
        if len(value) == 0:
            raise bad_request(f"`{param}` must not be an empty list.", param)
        if isinstance(value[0], int):
            return [{"prompt_token_ids": list(value)}]
        if isinstance(value[0], list):
            return [{"prompt_token_ids": ids} for ids in value]
        return list(value)

    async def apply_prompt(self, request: PoolingRequest, prompt_name: Optional[str],
                           prompt: Optional[str], default: bool) -> PoolingRequest:
        """The shared front's sentence-transformers prompt step, on the tokenizer thread
        (skipped when no prompt can apply); a bad name is a 400 listing the known ones."""
        if not request_front.prompt_applies(self.model_config, prompt_name, prompt, default):
            return request
        try:
            return await self.engine.run_in_tokenizer_thread(
                request_front.apply_prompt, self.engine.processor, request, prompt_name,
                prompt, default)
        except ValueError as exc:
            raise bad_request(str(exc), "prompt_name" if prompt_name else "prompt") from exc

    async def tokenize(self, request: PoolingRequest, param: Optional[str] = "input") -> list[Any]:
        """Engine prompts for `request`, through the shared front's tokenize step
        (vllm.engine.request_front) on the tokenizer thread; a refusal is a 400 naming
        `param`. Plain texts that surely fit go to the engine as `TextPrompt`s instead,
        which its loop tokenizes in one batch between steps (a text it refuses fails in
        `run`)."""
        how = request.tokenization
        self.limits.check_inputs(len(request.prompts), param)
        k = self.check_truncation(how.truncate_prompt_tokens, how.truncation_side)
        if not request.pairs and how.add_special_tokens and how.padding != "max_length" and \
                all(isinstance(p, str) for p in request.prompts) and \
                self.limits.texts_surely_fit(request.prompts):
            return [TextPrompt(p, k, how.truncation_side, how.prompt_len, how.cache_salt,
                               how.task_adapter) for p in request.prompts]
        try:
            tokenized = await self.engine.tokenize_request(
                request.tokenized_as(truncate_prompt_tokens=k))
        except ValueError as exc:
            raise bad_request(str(exc), getattr(exc, "field", param)) from exc
        self.limits.check_tokens(tokenized, param)
        return tokenized

    async def submit(self, http: Request, request: PoolingRequest, base_id: str,
                     param: Optional[str] = "input") -> list[Any]:
        """Tokenize `request` and run it: its outputs in prompt order."""
        return await self.run(http, request, await self.tokenize(request, param), base_id,
                              param)

    # ----- running --------------------------------------------------------------------
    async def run(self, http: Request, request: PoolingRequest, prompts: Sequence[Any],
                  base_id: str, param: Optional[str] = "input") -> list[Any]:
        """Send `prompts` (`request`'s, tokenized) to the engine at once (they share steps)
        with the request's verified params and adapter; return the outputs in prompt order.
        A client disconnect or a failure aborts all of them; a prompt the engine refuses is
        a 400 naming `param`. The request's `cache_salt` keeps its cached prefixes apart
        from every other salt's."""
        engine = self.engine
        salt = request.tokenization.cache_salt
        if salt is not None:
            prompts = [p if p.cache_salt == salt else dataclasses.replace(p, cache_salt=salt)
                       for p in prompts]
        self.limits.check_room(engine.num_pending, len(prompts))
        start = time.perf_counter()
        # Engine ids stay unique even when clients reuse an X-Request-Id.
        base_id = f"{base_id}-{next(self._request_counter)}"
        futures: list[asyncio.Future] = []
        watcher: Optional[_DisconnectWatcher] = None
        try:
            params = request_front.per_prompt(request)
            items = [(p, params[i], f"{base_id}-{i}") for i, p in enumerate(prompts)]
            futures = engine.submit_many(items, lora_request=request.lora) if request.lora \
                else engine.submit_many(items)
            everything = futures[0] if len(futures) == 1 else asyncio.gather(*futures)
            watcher = _DisconnectWatcher(http, everything)
            try:
                outputs = await everything
            except asyncio.CancelledError:
                if watcher.disconnected:
                    raise ClientDisconnected() from None
                raise
            outputs = outputs if isinstance(outputs, list) else [outputs]
        except APIError:
            raise
        except EngineDeadError as exc:
            raise engine_dead(exc) from exc
        except ValueError as exc:
            raise bad_request(str(exc), getattr(exc, "field", param)) from exc
        except Exception as exc:  # the engine failed while computing these prompts
            raise internal_error("The engine failed on this request.") from exc
        finally:
            if watcher is not None:
                watcher.cancel()
            for future in futures:  # after a failure or disconnect: abort the rest
                future.cancel()
        if self.metrics is not None:
            self.metrics.observe_engine_latency(time.perf_counter() - start)
        return outputs


# A request still running after this long starts listening for its client's disconnect.
DISCONNECT_WATCH_DELAY_S = 0.5


class _DisconnectWatcher:
    """Cancels `work` when the HTTP client disconnects. Listening needs a task per request
    (~35 us of event-loop time, about a tenth of a served request's), so it starts only
    once the request has run `DISCONNECT_WATCH_DELAY_S`: most answers are sent before."""

    def __init__(self, request: Request, work: asyncio.Future) -> None:
        self.request = request
        self.work = work
        self.disconnected = False
        self._task: Optional[asyncio.Task] = None
        self._timer = asyncio.get_running_loop().call_later(DISCONNECT_WATCH_DELAY_S,
                                                            self._start)

    def _start(self) -> None:
        if not self.work.done():
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def _listen(self) -> None:
        while (await self.request.receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        self.work.cancel()

    def cancel(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
