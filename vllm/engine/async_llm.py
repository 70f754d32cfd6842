"""AsyncLLM: the server's asynchronous front over one synchronous `LLMEngine`.

One background thread owns the engine and runs its step loop; every other thread
only talks to it through the `Inbox` (vllm/engine/inbox.py, one condition variable). Requests
that arrive while a step is running are added together before the next step, so
concurrent HTTP requests share engine steps (torch releases the GIL while the model
runs, so the event loop keeps accepting requests meanwhile).

The engine is built on that thread too (`from_engine_args`): a second OpenMP pool (one per
thread that runs parallel work) stops libgomp's spin-waiting, which slowed short steps
(docs/architecture.md, "Ownership").

Plain texts reach the engine untokenized (`TextPrompt`); the loop tokenizes every text
that arrived for a step in one batch call, between steps (tokenizing beside a running step
preempts its OpenMP threads: +6% requests/s at 32 clients, A/B). Token-id prompts, pairs
and /tokenize use one worker thread with its own tokenizer copy (a fast tokenizer keeps its
truncation settings on the object, so two threads sharing one truncated each other's texts).

When a step leaves the engine empty, the loop waits (`ArrivalWindow`) until as many requests
have arrived as the step finished, or none for a few ms, so the server answers HTTP between
steps instead of preempting the step's OpenMP threads (docs/architecture.md, "Ownership").

Both are CPU policies, switched on by the CPU platform (`Platform.serving_policy`). On CUDA
the step leaves the host's cores free: texts are tokenized on the tokenizer thread as they
arrive, overlapping the running step, and steps start as soon as requests are there.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

from vllm.engine.futures import Pending, resolve, resolve_outputs
from vllm.engine.inbox import IDLE, ArrivalWindow, Inbox
from vllm.engine.stats import EngineStats
from vllm.engine.prompt_types import TextPrompt
from vllm.engine.tokenizer_front import TokenizerFront
from vllm.logger import init_logger
from vllm.platforms import platform_for
from vllm.platforms.helper_threads import serial_torch_here
from vllm.platforms.interface import IdleTask
from vllm.pooling_params import PoolingParams
from vllm.tracing import EngineTimer, tokenizing

logger = init_logger(__name__)

# The prompt of the self-test run alone after a failed step (see `_engine_works`).
SELF_TEST_TEXT = "hello"
# A bounded backlog: the engine holds this many steps of waiting prompts; the rest wait as text.
BACKLOG_STEPS = 2


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (shut down or crashed); no request can be served."""


class AsyncLLM(TokenizerFront):
    """Runs an `LLMEngine` on a background thread and serves it to asyncio callers (an
    `EngineClient`, vllm.engine.protocol)."""

    supports_lora = True

    def __init__(self, engine: Any = None, *, start: bool = True,
                 build: Optional[Callable[[], Any]] = None,
                 arrival_window: Optional[ArrivalWindow] = ArrivalWindow(),
                 tokenize_between_steps: bool = True,
                 on_idle: Optional[IdleTask] = None,
                 bounded_backlog: bool = False) -> None:
        """Serve `engine`, or the engine `build()` returns: `build` runs on the engine
        thread (which then starts at once) and its exception is raised here.
        `arrival_window=None` starts every step at once. `tokenize_between_steps=False`
        tokenizes texts on the tokenizer thread as they arrive, overlapping the running
        step (for devices whose steps leave the host's cores free). `on_idle` runs on the
        engine thread once the engine has had no work for `on_idle.delay()` seconds after
        steps that finished requests (housekeeping, e.g. heap trims, kept out of busy
        periods: it would slow the steps that follow). `bounded_backlog`: the
        engine gets at most BACKLOG_STEPS x max_num_seqs waiting prompts at a time."""
        if (engine is None) == (build is None):
            raise TypeError("AsyncLLM needs exactly one of engine and build.")
        self._window = arrival_window
        self._tokenize_between_steps = tokenize_between_steps
        self._on_idle = on_idle
        self._inbox = Inbox()
        self._bounded, self._backlog = bounded_backlog, None
        self._error: Optional[BaseException] = None
        self._dead_callbacks: list[Callable[[], None]] = []
        self._timer = EngineTimer()  # the prompts of traced requests (vllm/tracing.py)
        self._tokenizer_pool = ThreadPoolExecutor(max_workers=1,
                                                  thread_name_prefix="vllm-tokenizer",
                                                  initializer=serial_torch_here)
        self._thread = threading.Thread(target=self._run, args=(build,),
                                        name="vllm-engine-loop", daemon=True)
        if build is not None:
            self._built = threading.Event()
            self._thread.start()
            self._built.wait()
            if self._error is not None:
                raise self._error
        else:
            self._attach(engine)
            if start:
                self._thread.start()

    def _attach(self, engine: Any) -> None:
        self.engine = engine
        self.vllm_config = engine.vllm_config
        self.model_config = engine.vllm_config.model_config
        # The tokenizer thread's own processor; the engine's is used by the engine loop only.
        self.processor = engine.processor.clone()
        self.tokenizer = self.processor.tokenizer
        if self._bounded:
            self._backlog = BACKLOG_STEPS * engine.vllm_config.scheduler_config.max_num_seqs

    @classmethod
    def from_engine_args(cls, engine_args: Any) -> "AsyncLLM":
        """Build the engine on the engine thread and serve it with its platform's serving
        policy. The platform's process settings come first (on CPU the engine thread must
        share the main heap from its first allocation)."""
        from vllm.engine.llm_engine import LLMEngine
        platform = platform_for(engine_args.device)
        policy = platform.serving_policy()
        platform.prepare_server()
        logger.info("Serving policy: %s; %s.", "texts tokenized by the engine loop between "
                    "steps" if policy.tokenize_between_steps else "texts tokenized on the "
                    "tokenizer thread while steps run", "a drained engine waits a few ms for "
                    "the next requests" if policy.arrival_window else "steps start at once")
        return cls(build=lambda: LLMEngine.from_engine_args(engine_args),
                   arrival_window=ArrivalWindow() if policy.arrival_window else None,
                   tokenize_between_steps=policy.tokenize_between_steps,
                   on_idle=platform.on_idle(), bounded_backlog=True)

    # ----- health -------------------------------------------------------------------
    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self._error is None and not self._inbox.stopping

    @property
    def errored(self) -> bool:
        return self._error is not None

    @property
    def dead_error(self) -> EngineDeadError:
        if self._error is not None:
            return EngineDeadError("The engine stopped after an internal error and can no "
                                   "longer serve; the server is shutting down.")
        return EngineDeadError("The engine is not running (it was shut down).")

    def on_dead(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from the engine thread) once the loop has died of an error and
        every request in flight has been failed; at once if it already has. The server
        uses it to exit non-zero, so that a supervisor restarts it."""
        with self._inbox.cv:
            if self._error is None:
                self._dead_callbacks.append(callback)
                return
        callback()

    @property
    def num_pending(self) -> int:
        """Prompts submitted and not yet answered (waiting, tokenizing or running)."""
        return len(self._inbox.pending)

    @property
    def stats(self) -> EngineStats:
        """The engine's live counters (steps, prefix-cache hits, ...); inbox = waiting."""
        stats = self.engine.stats
        if self._backlog is not None:
            stats.num_waiting += self._inbox.num_queued
        return stats

    def reset_stats(self) -> None:
        """The engine's counters from zero; only while nothing is in flight (the server
        calls it after its warm-up, whose requests have all been answered)."""
        if self.num_pending:
            raise RuntimeError("reset_stats needs an idle engine.")
        self.engine.reset_stats()

    def replica_stats(self) -> dict[str, EngineStats]:
        return {}  # one engine: no replicas (EngineClient)

    def health_report(self) -> None:
        return None  # /health: a plain 200 while alive (EngineClient)

    async def refresh_stats(self) -> None:
        """The counters are read live (EngineClient: a no-op here)."""

    # ----- requests --------------------------------------------------------------------
    def submit(self, prompt: Any, params: Any, request_id: str) -> asyncio.Future:
        """Hand one prompt (tokenized, or a `TextPrompt` the loop tokenizes) to the engine;
        the returned plain future (no task per prompt) resolves to its output."""
        return self.submit_many([(prompt, params, request_id)])[0]

    def submit_many(self, items: Sequence[tuple[Any, Any, str]],
                    lora_request: Any = None) -> list[asyncio.Future]:
        """Futures (of the running event loop) of each (prompt, params, request_id)'s
        PoolingRequestOutput, handed over together (one lock, one wake-up): no step starts
        with only some of one HTTP request's prompts. Cancelling a future aborts its
        request. Raises ValueError for a duplicate id (none is taken), EngineDeadError when
        the engine is not running; a prompt the tokenizer or engine refuses fails its
        future with ValueError. `lora_request`: the adapter every item runs under."""
        loop = asyncio.get_running_loop()
        pendings = [(rid, Pending(loop, loop.create_future(), prompt, params, lora_request))
                    for prompt, params, rid in items]
        overlap = [not self._tokenize_between_steps and isinstance(p.prompt, TextPrompt)
                   for _, p in pendings]
        trace = self._timer.start(pendings)
        try:
            self._inbox.put([(rid, p, not later) for (rid, p), later in zip(pendings, overlap)],
                            check=self._refuse_if_dead)
        except BaseException:
            self._timer.drop(pendings)
            raise
        for (rid, pending), later in zip(pendings, overlap):
            if trace is not None:
                self._timer.watch(trace, rid, pending.future)
            if later:
                self._tokenizer_pool.submit(self._tokenize_then_queue, rid, pending)
            pending.future.add_done_callback(
                lambda f, rid=rid: self.abort([rid]) if f.cancelled() else None)
        return [pending.future for _, pending in pendings]

    def check_lora(self, lora_request: Any) -> None:
        """Check an adapter without loading it (ValueError if refused); any thread."""
        lora = self.engine.runner.lora
        if lora is None:
            raise ValueError("LoRA is not enabled; start the server with --enable-lora.")
        lora.check(lora_request)

    def _refuse_if_dead(self) -> None:
        if not self.is_alive:
            raise self.dead_error

    async def run_in_tokenizer_thread(self, fn: Callable[..., Any], *args: Any,
                                      **kwargs: Any) -> Any:
        """TokenizerFront's, and for a traced request the time it took (tokenizing)."""
        with tokenizing():
            return await super().run_in_tokenizer_thread(fn, *args, **kwargs)

    def _tokenize_then_queue(self, request_id: str, pending: Pending) -> None:
        """On the tokenizer thread, while a step may be running: tokenize the text, then
        queue the request (unless it was aborted meanwhile); a refusal fails it in `_admit`."""
        start = time.perf_counter()
        pending.prompt = self.processor.tokenize_texts([pending.prompt])[0]
        self._timer.tokenized([request_id], time.perf_counter() - start)
        self._inbox.queue(request_id, pending)

    async def encode(self, prompt: Any, params: Any, request_id: str) -> Any:
        """`submit` and wait. Cancelling the awaiting task (e.g. the client went away)
        aborts the request."""
        return await self.submit(prompt, params, request_id)

    def abort(self, request_ids: Sequence[str]) -> None:
        """Forget these requests; those already in the engine are aborted there."""
        self._inbox.abort(request_ids)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop after the step in flight; fail every request still waiting."""
        self._inbox.stop()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._tokenizer_pool.shutdown(wait=False, cancel_futures=True)
        self._fail_all(EngineDeadError("The engine was shut down."))

    # ----- the engine thread ---------------------------------------------------------
    def _run(self, build: Optional[Callable[[], Any]] = None) -> None:
        if build is not None:
            try:
                self._attach(build())
            except BaseException as exc:
                self._error = exc
                return
            finally:
                self._built.set()
        busy, idle_due = False, False
        try:
            while True:
                room = None if self._backlog is None else \
                    self._backlog - self.engine.num_waiting
                timeout = self._on_idle.delay() if idle_due and not busy else None
                work = self._inbox.next_work(busy, room, timeout)
                if work is None:
                    break
                if work is IDLE:  # idle for `timeout`
                    idle_due = False
                    self._on_idle()
                    continue
                self._admit(*work)
                finished = 0
                try:
                    finished = self._step()
                except Exception as exc:  # fails the step's requests; the engine goes on
                    self._fail_in_flight(exc)
                    if not self._engine_works():
                        raise
                busy = self.engine.has_unfinished_requests()
                idle_due = idle_due or (finished > 0 and self._on_idle is not None)
                if finished and not busy and self._window is not None:
                    self._inbox.await_arrivals(finished, self._window)
        except BaseException as exc:  # the engine itself failed: every request fails
            logger.exception("The engine loop failed; the server can no longer serve.")
            with self._inbox.cv:
                self._error = exc
                callbacks, self._dead_callbacks = self._dead_callbacks, []
            self._fail_all(self.dead_error)
            for callback in callbacks:
                callback()

    def _admit(self, aborts: list[str], new: list[tuple[str, Pending]]) -> None:
        """Apply aborts, tokenize the new texts in one batch, then add the new requests; a
        request the tokenizer or the engine refuses fails alone."""
        if aborts:
            try:
                self.engine.abort_request(aborts)
            except (KeyError, ValueError):  # finished meanwhile: nothing to abort
                logger.debug("Abort of finished request(s) %s ignored.", aborts)
        texts = [p for _, p in new if isinstance(p.prompt, TextPrompt)]
        if texts:
            start = time.perf_counter()
            try:  # a text the tokenizer refuses fails alone (as a ValueError in its place)
                tokenized = self.engine.processor.tokenize_texts([p.prompt for p in texts])
            except Exception:  # never expected; still no request may stop the loop
                logger.exception("Tokenizing %d texts failed.", len(texts))
                tokenized = [ValueError("The tokenizer could not encode this text.")] * \
                    len(texts)
            if self._timer.active:
                self._timer.tokenized([rid for rid, p in new  # (texts, not yet replaced)
                                       if isinstance(p.prompt, TextPrompt)],
                                      time.perf_counter() - start)
            for p, result in zip(texts, tokenized):
                p.prompt = result
        for rid, pending in new:
            try:
                if isinstance(pending.prompt, ValueError):
                    raise pending.prompt
                adapter = (pending.lora,) if pending.lora is not None else ()
                self.engine.add_request(rid, pending.prompt, pending.params, *adapter)
                self._timer.added(rid)
            except Exception as exc:
                self._inbox.forget(rid)
                resolve(pending, error=exc)

    def _step(self) -> int:
        """Run one engine step and resolve the requests it finished; returns how many."""
        engine = self.engine
        if not engine.has_unfinished_requests():
            return 0
        steps = engine.stats.num_steps
        timer = self._timer if self._timer.active else None
        start = timer.step_begins(engine.runner.model) if timer else 0.0
        outputs = engine.step()
        if timer:
            timer.step_done(start, outputs, engine.scheduler.waiting)
        resolve_outputs(self._inbox.finished(outputs))
        if not outputs and engine.stats.num_steps == steps:
            self._inbox.pause(0.005)  # nothing could be scheduled: do not spin
        return len(outputs)

    def _engine_works(self) -> bool:
        """After a failed step, whose requests have all been failed: run one short request
        alone. When it succeeds, the failure came from what was in flight and the engine
        serves on (no request's content can stop it); when it fails too, the engine itself
        is broken (e.g. the device is gone) and the loop stops."""
        engine = self.engine
        rid = f"vllm-self-test-{time.monotonic_ns()}"
        try:
            params = PoolingParams()
            params.task = next(iter(self.model_config.supported_tasks))
            engine.add_request(rid, engine.processor.tokenize_prompt(SELF_TEST_TEXT), params)
            for _ in range(self.model_config.max_model_len + 1):
                if any(o.request_id == rid for o in engine.step()):
                    logger.info("The engine passed its self-test after a failed step; "
                                "serving on.")
                    return True
        except Exception:
            logger.exception("The engine failed its self-test after a failed step.")
        return False

    def _fail_in_flight(self, error: Exception) -> None:
        """A step raised: fail (and abort) the requests inside the engine, keep serving."""
        logger.exception("An engine step failed; failing the requests in flight.")
        failed = self._inbox.take_added()
        try:
            self.engine.abort_request([rid for rid, _ in failed])
        except (KeyError, ValueError):
            pass
        for _, p in failed:
            resolve(p, error=error)

    def _fail_all(self, error: BaseException) -> None:
        for p in self._inbox.drain():
            resolve(p, error=error)
