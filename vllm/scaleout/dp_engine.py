"""DPAsyncLLM: N engine replicas behind one front, with AsyncLLM's interface.

The API server runs unchanged on top of it: routes, validation, tokenization of token-id
prompts and pairs, response bodies and error mapping all happen in the front exactly as
with one replica; only each prompt's engine work is sent to a replica (`submit`). So every
route answers the same bodies and errors as with one replica.

Per prompt: when the model caches prefixes, texts are tokenized here first (one batch call
per event-loop pass, on the tokenizer thread) so the router can see their leading blocks;
otherwise they go to the least-loaded replica untokenized and the replica tokenizes them.

Faults: a replica that dies (its process or actor is gone) has each in-flight request
re-sent once to another replica; a request whose second replica also dies, or with no other
replica up, fails with EngineDeadError (a 503). The replica is then restarted in the
background and rejoins the routing when its engine is loaded.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from vllm.engine.async_llm import EngineDeadError
from vllm.engine.tokenizer_front import TokenizerFront
from vllm.engine.processor import InputProcessor, load_tokenizer
from vllm.engine.prompt_types import TextPrompt
from vllm.logger import init_logger
from vllm.platforms.helper_threads import serial_torch_here
from vllm.scaleout.router import PrefixRouter
from vllm.scaleout.wire import unpack
from vllm.tracing import current_trace, tokenizing

logger = init_logger(__name__)

RESTART_BACKOFF_S = 5.0


@dataclass
class _Flight:
    future: asyncio.Future
    prompt: Any
    params: Any
    replica: Any = None  # the handle computing it (None while tokenizing or re-routing)
    retried: bool = False


class DPAsyncLLM(TokenizerFront):
    """N engine replicas behind a prefix-aware router, served as one `EngineClient`
    (vllm.engine.protocol)."""

    supports_lora = False  # adapters are served from one engine (check_lora says so)

    def __init__(self, vllm_config: Any, make_replica: Callable[[int], Any], size: int,
                 backend: str = "mp") -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.processor = InputProcessor(self.model_config, load_tokenizer(self.model_config))
        self.tokenizer = self.processor.tokenizer
        self._tokenizer_pool = ThreadPoolExecutor(max_workers=1,
                                                  thread_name_prefix="vllm-tokenizer",
                                                  initializer=serial_torch_here)
        self.backend = backend
        self.size = size
        caching = bool(vllm_config.cache_config.enable_prefix_caching)
        self.router = PrefixRouter(size, vllm_config.cache_config.block_size,
                                   prefix_aware=caching,
                                   slack=vllm_config.scheduler_config.max_num_seqs // 2)
        self._tokenize_here = caching
        self._make_replica = make_replica
        self.replicas: list[Any] = [make_replica(i) for i in range(size)]
        self._alive = [False] * size
        self._loads = [0] * size
        self._flights: dict[str, _Flight] = {}
        self._outbox: dict[Any, list] = {}
        self._to_tokenize: list[str] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stopping = False
        self.restarts = 0
        self.retried = 0  # requests re-sent after their replica died
        self._stats: dict[str, Any] = {}
        logger.info("Data parallel: %d replicas (%s backend); routing %s.", size, backend,
                    "prefix-aware (prefix caching is on)" if caching else
                    "to the least-loaded replica (prefix caching is off)")

    # ----- start-up -----------------------------------------------------------------
    @classmethod
    def start(cls, engine_args: Any, size: int, backend: str, args: Any = None) -> "DPAsyncLLM":
        """Resolve the config here (no weights), then start every replica in parallel."""
        from vllm.scaleout.replicas import replica_factory
        vllm_config = engine_args.create_engine_config()
        holder: list[DPAsyncLLM] = []
        factory = replica_factory(backend, engine_args, size, vllm_config, args,
                                  lambda: holder[0])
        self = cls(vllm_config, factory, size, backend)
        holder.append(self)
        with ThreadPoolExecutor(max_workers=size) as pool:
            errors = [f.exception() for f in [pool.submit(r.start) for r in self.replicas]]
        for i, exc in enumerate(errors):
            self._alive[i] = exc is None
            if exc is not None:
                logger.error("Replica %d did not start: %s", i, exc)
        if not any(self._alive):
            self.shutdown()
            raise RuntimeError(f"No replica started: {errors[0]}")
        return self

    # ----- health -------------------------------------------------------------------
    @property
    def is_alive(self) -> bool:
        return not self._stopping and any(self._alive)

    @property
    def errored(self) -> bool:
        """Never: a dead replica is restarted, so the front itself does not die."""
        return False

    def on_dead(self, callback: Callable[[], None]) -> None:
        """AsyncLLM's hook for a dead engine. The replicas are restarted instead, so the
        front never calls it (the server keeps serving on the live replicas)."""

    @property
    def num_pending(self) -> int:
        """Prompts submitted and not yet answered, over all replicas."""
        return len(self._flights)

    @property
    def dead_error(self) -> EngineDeadError:
        if self._stopping:
            return EngineDeadError("The engine is not running (it was shut down).")
        return EngineDeadError(f"No engine replica is up (0 of {self.size}); they are being "
                               "restarted, retry shortly.")

    def health_report(self) -> dict[str, Any]:
        return {"replicas": self.size, "replicas_up": sum(self._alive),
                "backend": self.backend}

    # ----- requests (event loop) -----------------------------------------------------
    def submit(self, prompt: Any, params: Any, request_id: str) -> asyncio.Future:
        """As `AsyncLLM.submit`: a future of the prompt's PoolingRequestOutput; cancelling
        it aborts the request on its replica."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        if not self.is_alive:
            raise self.dead_error
        if request_id in self._flights:
            raise ValueError(f"Request id {request_id!r} is already running.")
        future = loop.create_future()
        self._flights[request_id] = _Flight(future, prompt, params)
        future.add_done_callback(lambda f: self._cancelled(request_id) if f.cancelled()
                                 else None)
        if self._tokenize_here and isinstance(prompt, TextPrompt):
            if not self._to_tokenize:
                loop.call_soon(self._tokenize_queued)
            self._to_tokenize.append(request_id)
        else:
            self._dispatch(request_id)
        return future

    def submit_many(self, items: Sequence[tuple[Any, Any, str]]) -> list[asyncio.Future]:
        """`submit` for each (prompt, params, request_id): one request's prompts are
        flushed to the replicas together on the event loop's next turn. A traced
        request's (vllm/tracing.py) prompts count in its span, without engine timings: the
        replicas run in other processes."""
        futures = [self.submit(prompt, params, rid) for prompt, params, rid in items]
        trace = current_trace()
        if trace is not None:
            for (_, _, rid), future in zip(items, futures):
                trace.watch(rid, future)
        return futures

    async def run_in_tokenizer_thread(self, fn: Callable[..., Any], *args: Any,
                                      **kwargs: Any) -> Any:
        """TokenizerFront's, and for a traced request the time it took (tokenizing)."""
        with tokenizing():
            return await super().run_in_tokenizer_thread(fn, *args, **kwargs)

    async def encode(self, prompt: Any, params: Any, request_id: str) -> Any:
        return await self.submit(prompt, params, request_id)

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            flight = self._flights.get(rid)
            if flight is not None:
                flight.future.cancel()

    def _tokenize_queued(self) -> None:
        ids, self._to_tokenize = self._to_tokenize, []
        flights = [(rid, self._flights.get(rid)) for rid in ids]
        flights = [(rid, f) for rid, f in flights if f is not None]
        texts = [f.prompt for _, f in flights]
        work = self._loop.run_in_executor(self._tokenizer_pool,
                                          self.processor.tokenize_texts, texts)
        work.add_done_callback(lambda w: self._tokenized(flights, w))

    def _tokenized(self, flights: list, work: asyncio.Future) -> None:
        failed = work.exception()
        results = [failed] * len(flights) if failed else work.result()
        for (rid, flight), result in zip(flights, results):
            if flight.future.done():
                continue
            if isinstance(result, BaseException):
                self._finish(rid, None, result)
            else:
                flight.prompt = result
                self._dispatch(rid)

    def _dispatch(self, rid: str, avoid: Any = None) -> None:
        """Route one request and queue it for its replica (sent once per loop pass)."""
        flight = self._flights.get(rid)
        if flight is None or flight.future.done():
            return
        alive = [a and self.replicas[i] is not avoid for i, a in enumerate(self._alive)]
        try:
            index = self.router.route(getattr(flight.prompt, "prompt_token_ids", None),
                                      self._loads, alive,
                                      getattr(flight.prompt, "cache_salt", None))
        except LookupError:
            self._finish(rid, None, EngineDeadError(
                "The replica computing this request died and no other replica is up; "
                "retry shortly." if flight.retried else str(self.dead_error)))
            return
        replica = self.replicas[index]
        flight.replica = replica
        self._loads[index] += 1
        self._queue(replica, "submit", (rid, flight.prompt, flight.params))

    def _queue(self, replica: Any, kind: str, item: Any) -> None:
        if not self._outbox:
            self._loop.call_soon(self._flush)
        self._outbox.setdefault(replica, []).append((kind, item))

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, {}
        for replica, items in outbox.items():
            aborts = [item for kind, item in items if kind == "abort"]
            submits = [item for kind, item in items if kind == "submit"]
            if submits:
                replica.submit(submits)
            if aborts:
                replica.abort(aborts)

    def _finish(self, rid: str, output: Any, error: Optional[BaseException]) -> None:
        flight = self._flights.pop(rid, None)
        if flight is None:
            return
        if flight.replica is not None:
            self._loads[flight.replica.index] -= 1
        if flight.future.done():
            return
        if error is not None:
            flight.future.set_exception(error)
        else:
            flight.future.set_result(output)

    def _cancelled(self, rid: str) -> None:
        flight = self._flights.get(rid)
        if flight is None:
            return
        replica = flight.replica
        self._finish(rid, None, None)
        if replica is not None and self._alive[replica.index]:
            self._queue(replica, "abort", rid)

    # ----- replica events (event loop) -----------------------------------------------
    def post(self, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` on the front's event loop (directly before the first request)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    def replica_results(self, replica: Any, results: list) -> None:
        for result in results:
            flight = self._flights.get(result[0])
            if flight is not None and flight.replica is replica:
                output, error = unpack(result)
                self._finish(result[0], output, error)

    def replica_died(self, replica: Any) -> None:
        index = replica.index
        if self.replicas[index] is not replica or self._stopping:
            return
        self._alive[index] = False
        self._loads[index] = 0
        self._outbox.pop(replica, None)
        self.router.forget(index)
        victims = [rid for rid, f in self._flights.items() if f.replica is replica]
        logger.warning("Replica %d died with %d request(s) in flight; retrying them on the "
                       "other replicas and restarting it.", index, len(victims))
        for rid in victims:
            flight = self._flights[rid]
            flight.replica = None
            if flight.retried:
                self._finish(rid, None, EngineDeadError(
                    "Two replicas died while computing this request; retry it."))
            else:
                flight.retried = True
                self.retried += 1
                self._dispatch(rid, avoid=replica)
        threading.Thread(target=self._restart, args=(index,), daemon=True,
                         name=f"vllm-replica-{index}-restart").start()

    def _restart(self, index: int) -> None:
        while not self._stopping:
            replica = self._make_replica(index)
            try:
                replica.start()
            except Exception as exc:
                logger.error("Restarting replica %d failed (%s); trying again in %.0f s.",
                             index, exc, RESTART_BACKOFF_S)
                time.sleep(RESTART_BACKOFF_S)
                continue
            self.post(self._revived, replica)
            return

    def _revived(self, replica: Any) -> None:
        if self._stopping:
            replica.stop()
            return
        self.replicas[replica.index] = replica
        self._alive[replica.index] = True
        self.restarts += 1
        logger.info("Replica %d restarted and serving again.", replica.index)

    # ----- stats and shutdown --------------------------------------------------------
    async def refresh_stats(self) -> None:
        """Fetch every live replica's counters (for /metrics)."""
        live = [r for i, r in enumerate(self.replicas) if self._alive[i]]
        got = await asyncio.gather(*[r.fetch_stats() for r in live], return_exceptions=True)
        for replica, stats in zip(live, got):
            if not isinstance(stats, BaseException):
                self._stats[str(replica.index)] = stats

    @property
    def stats(self) -> dict[str, Any]:
        """The last fetched counters of each replica, by replica label."""
        return dict(self._stats)

    def replica_stats(self) -> dict[str, Any]:
        return self.stats

    def check_lora(self, lora_request: Any) -> None:
        """EngineClient's adapter check: adapters are served from one engine only."""
        raise ValueError("LoRA adapters are not supported with data parallel replicas "
                         "(--data-parallel-size > 1); serve them from one engine.")

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop every replica (after the front has drained its requests)."""
        self._stopping = True
        for replica in self.replicas:
            try:
                replica.stop(timeout)
            except Exception:  # a replica that never started
                pass
        self._tokenizer_pool.shutdown(wait=False, cancel_futures=True)
        for rid in list(self._flights):
            self._finish(rid, None, EngineDeadError("The engine was shut down."))
