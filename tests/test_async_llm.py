"""AsyncLLM on a scripted fake engine: batching, abort on cancel, per-request failures,
engine death (and /health turning 503), shutdown, tokenization off the event loop."""
from __future__ import annotations

import asyncio
import sys
import threading
import time
import types

import httpx
import pytest
import torch

from vllm.config.pooler import PoolerConfig
from vllm.engine.async_llm import AsyncLLM, ArrivalWindow, EngineDeadError
from vllm.outputs import PoolingOutput, PoolingRequestOutput


class FakeEngine:
    """Each request needs `steps_per_request` steps; `gate` (when set) holds every step."""

    def __init__(self, steps_per_request: int = 1) -> None:
        model_config = types.SimpleNamespace(model="fake", max_model_len=16,
                                             supported_tasks=("encode", "embed"),
                                             pooling_tasks=("embed", "token_embed"),
                                             encode_task="encode", is_multi_vector=False,
                                             default_prompt_name=None)
        self.vllm_config = types.SimpleNamespace(model_config=model_config)
        self.tokenizer = None
        self.processor = types.SimpleNamespace(
            tokenize_many=lambda prompts, truncate=None, side=None: [
                (threading.current_thread().name, p) for p in prompts],
            check_truncation=lambda k: k, check_side=lambda side: side,
            with_prompt=lambda prompts, *args, **kwargs: prompts,
            tokenize_texts=lambda prompts: [
                (threading.current_thread().name, p.text) for p in prompts],
            tokenize_prompt=lambda prompt, *a, **k: prompt, tokenize_pair=None, tokenizer=None)
        self.processor.clone = lambda: self.processor
        self.steps_per_request = steps_per_request
        self.running: dict[str, int] = {}
        self.batches: list[list[str]] = []
        self.aborted: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.in_step = threading.Event()
        self.failing_steps = 0  # how many of the next steps raise
        self.stats = types.SimpleNamespace(num_steps=0)

    def add_request(self, request_id, prompt, params) -> None:
        if params == "bad":
            raise ValueError("bad params")
        self.running[request_id] = 0

    def abort_request(self, request_ids) -> None:
        for rid in request_ids:
            self.aborted.append(rid)
            self.running.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self):
        self.in_step.set()
        self.gate.wait(10)
        if self.failing_steps:
            self.failing_steps -= 1
            raise RuntimeError("device lost")
        self.batches.append(sorted(self.running))
        self.stats.num_steps += 1
        done = []
        for rid in list(self.running):
            self.running[rid] += 1
            if self.running[rid] >= self.steps_per_request:
                del self.running[rid]
                done.append(PoolingRequestOutput(rid, PoolingOutput(torch.ones(2)), [1, 2]))
        return done


async def _hold_a_step(engine: FakeEngine, llm: AsyncLLM, request_id: str) -> asyncio.Future:
    """Start `request_id` and return once the engine is inside its (held) step."""
    engine.gate.clear()
    first = asyncio.ensure_future(llm.encode("p", None, request_id))
    while not engine.in_step.is_set():
        await asyncio.sleep(0.001)
    return first


@pytest.fixture
def fake():
    engine = FakeEngine()
    llm = AsyncLLM(engine)
    yield engine, llm
    llm.shutdown()


def test_build_runs_on_the_engine_thread():
    """The engine (and so every torch thread pool) is created on the thread that steps it."""
    names = []

    def build():
        names.append(threading.current_thread().name)
        return FakeEngine()
    llm = AsyncLLM(build=build)
    try:
        assert names == ["vllm-engine-loop"] and llm.is_alive
        assert asyncio.run(llm.encode("p", None, "a")).request_id == "a"
    finally:
        llm.shutdown()


def test_build_error_is_raised_by_the_constructor():
    def build():
        raise ValueError("no such model")
    with pytest.raises(ValueError, match="no such model"):
        AsyncLLM(build=build)
    with pytest.raises(TypeError, match="exactly one of engine and build"):
        AsyncLLM()


def test_requests_arriving_during_a_step_share_the_next_one(fake):
    engine, llm = fake

    async def main():
        first = await _hold_a_step(engine, llm, "a")
        rest = [asyncio.ensure_future(llm.encode("p", None, f"b{i}")) for i in range(5)]
        await asyncio.sleep(0.05)
        engine.gate.set()
        return await asyncio.gather(first, *rest)

    outputs = asyncio.run(main())
    assert [o.request_id for o in outputs] == ["a"] + [f"b{i}" for i in range(5)]
    assert engine.batches == [["a"], [f"b{i}" for i in range(5)]]
    assert llm.stats.num_steps == 2


async def _closed_loop(engine: FakeEngine, llm: AsyncLLM, delays: list) -> dict[str, float]:
    """Hold a step, queue one request per client behind it, release; client i then sends
    its next request `delays[i]` seconds after its first one returned (None: never).
    Returns each second request's seconds from submission to answer."""
    first = await _hold_a_step(engine, llm, "a")
    waited: dict[str, float] = {}

    async def client(i: int, delay) -> None:
        await llm.encode("p", None, f"b{i}")
        if delay is not None:
            await asyncio.sleep(delay)
            start = time.perf_counter()
            await llm.encode("p", None, f"c{i}")
            waited[f"c{i}"] = time.perf_counter() - start
    clients = [asyncio.ensure_future(client(i, d)) for i, d in enumerate(delays)]
    await asyncio.sleep(0.05)
    engine.gate.set()
    await asyncio.gather(first, *clients)
    return waited


@pytest.mark.parametrize("window", [ArrivalWindow(gap=0.5, cap=5.0), None])
def test_a_drained_engine_waits_for_as_many_requests_as_it_finished(window):
    """Three clients answered by one step come back 0, 40 and 80 ms later: with the
    window they share the next step; without it the first starts a step alone."""
    engine = FakeEngine()
    llm = AsyncLLM(engine, arrival_window=window)
    try:
        asyncio.run(_closed_loop(engine, llm, [0.0, 0.04, 0.08]))
    finally:
        llm.shutdown()
    assert engine.batches[:2] == [["a"], ["b0", "b1", "b2"]]
    if window is not None:
        assert engine.batches[2:] == [["c0", "c1", "c2"]]
    else:
        assert engine.batches[2] == ["c0"] and len(engine.batches) > 3


def test_the_window_closes_a_gap_after_the_last_arrival():
    """Of three clients only one comes back: its step starts one gap after it arrived,
    not at the cap."""
    engine = FakeEngine()
    llm = AsyncLLM(engine, arrival_window=ArrivalWindow(gap=0.2, cap=30.0))
    try:
        waited = asyncio.run(_closed_loop(engine, llm, [0.0, None, None]))
    finally:
        llm.shutdown()
    assert engine.batches == [["a"], ["b0", "b1", "b2"], ["c0"]]
    assert 0.2 <= waited["c0"] < 5.0


def test_cancel_aborts_the_engine_request():
    engine = FakeEngine(steps_per_request=10 ** 9)
    llm = AsyncLLM(engine)
    try:
        async def main():
            task = asyncio.ensure_future(llm.encode("p", None, "slow"))
            while not engine.batches:
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(500):
                if "slow" in engine.aborted:
                    break
                await asyncio.sleep(0.01)
        asyncio.run(main())
        assert engine.aborted == ["slow"] and not engine.running
    finally:
        llm.shutdown()


def test_cancelling_a_submitted_future_aborts_the_engine_request():
    """The server awaits plain futures (no task per prompt): cancelling one aborts it."""
    engine = FakeEngine(steps_per_request=10 ** 9)
    llm = AsyncLLM(engine)
    try:
        async def main():
            future = llm.submit("p", None, "slow")
            with pytest.raises(ValueError, match="already running"):
                llm.submit("p", None, "slow")
            while not engine.batches:
                await asyncio.sleep(0.001)
            future.cancel()
            for _ in range(500):
                if "slow" in engine.aborted:
                    break
                await asyncio.sleep(0.01)
        asyncio.run(main())
        assert engine.aborted == ["slow"] and not engine.running and llm.num_pending == 0
    finally:
        llm.shutdown()


def test_texts_are_tokenized_on_the_engine_thread_in_one_batch(fake):
    """Texts that arrive for one step are tokenized together by the engine loop (not on
    the event loop or beside a running step); a text the tokenizer refuses fails alone."""
    from vllm.engine.prompt_types import TextPrompt
    engine, llm = fake
    batches = []

    def tokenize_texts(prompts):
        batches.append((threading.current_thread().name, [p.text for p in prompts]))
        return [ValueError("too long") if p.text == "bad" else ("ids", p.text)
                for p in prompts]
    engine.processor.tokenize_texts = tokenize_texts

    async def main():
        blocker = await _hold_a_step(engine, llm, "first")
        rest = [asyncio.ensure_future(llm.encode(TextPrompt(t), None, t))
                for t in ("x", "bad", "y")]
        await asyncio.sleep(0.05)
        engine.gate.set()
        return await asyncio.gather(blocker, *rest, return_exceptions=True)

    first, x, bad, y = asyncio.run(main())
    assert batches == [("vllm-engine-loop", ["x", "bad", "y"])]
    assert x.request_id == "x" and y.request_id == "y"
    assert isinstance(bad, ValueError) and "too long" in str(bad)
    assert engine.batches[-1] == ["x", "y"] and llm.is_alive


def test_overlapped_tokenization_runs_beside_the_step(fake):
    """The CUDA platform's policy (`tokenize_between_steps=False`): a text is tokenized on
    the tokenizer thread while a step runs, and joins the next step; a refused text fails
    alone."""
    from vllm.engine.prompt_types import TextPrompt
    engine, cpu_llm = fake
    cpu_llm.shutdown()
    llm = AsyncLLM(engine, arrival_window=None, tokenize_between_steps=False)
    seen = []

    def tokenize_texts(prompts):
        seen.append((threading.current_thread().name, engine.in_step.is_set(),
                     [p.text for p in prompts]))
        return [ValueError("too long") if p.text == "bad" else ("ids", p.text)
                for p in prompts]
    engine.processor.tokenize_texts = tokenize_texts

    async def main():
        blocker = await _hold_a_step(engine, llm, "first")
        rest = [asyncio.ensure_future(llm.encode(TextPrompt(t), None, t)) for t in ("x", "bad")]
        while len(seen) < 2:
            await asyncio.sleep(0.005)
        engine.gate.set()
        return await asyncio.gather(blocker, *rest, return_exceptions=True)

    try:
        first, x, bad = asyncio.run(main())
    finally:
        llm.shutdown()
    assert [(name.startswith("vllm-tokenizer"), in_step) for name, in_step, _ in seen] == \
        [(True, True), (True, True)]   # on the tokenizer thread, while the step was held
    assert x.request_id == "x" and isinstance(bad, ValueError)


def test_processor_tokenize_texts_isolates_a_bad_text(minilm_dir):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.processor import InputProcessor, load_tokenizer
    from vllm.engine.prompt_types import TextPrompt
    mc = EngineArgs(model=str(minilm_dir)).create_engine_config().model_config
    processor = InputProcessor(mc, load_tokenizer(mc))
    prompts = [TextPrompt("hello world"), TextPrompt("word " * 400),
               TextPrompt("word " * 400, truncate_prompt_tokens=8), TextPrompt("a b c")]
    out = processor.tokenize_texts(prompts)
    assert isinstance(out[1], ValueError) and "maximum context length" in str(out[1])
    for i in (0, 3):
        assert out[i].prompt_token_ids == processor.tokenize_prompt(prompts[i].text)\
            .prompt_token_ids
    assert len(out[2].prompt_token_ids) == 8


def test_tokenizer_thread_and_engine_loop_truncate_independently(minilm_dir):
    """The engine loop (texts, no truncation) and the tokenizer thread (truncation to 8)
    tokenize at the same time. A Hugging Face tokenizer keeps its truncation settings on
    the object, so one shared by both threads truncated texts wrongly (in a stand-alone
    stress, 50 of 600 calls); the identity check below is what always catches sharing,
    the stress shows the outputs stay right."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.processor import InputProcessor, load_tokenizer
    from vllm.engine.prompt_types import TextPrompt
    mc = EngineArgs(model=str(minilm_dir)).create_engine_config().model_config
    engine_side = InputProcessor(mc, load_tokenizer(mc))
    thread_side = engine_side.clone()
    assert thread_side.tokenizer.backend_tokenizer is not engine_side.tokenizer.backend_tokenizer
    texts = [f"text {i} " + "word " * (60 + i) for i in range(64)]
    full = [len(p.prompt_token_ids) for p in engine_side.tokenize_many(texts)]
    wrong: list[str] = []

    def engine_loop() -> None:
        for _ in range(100):
            out = engine_side.tokenize_texts([TextPrompt(t) for t in texts])
            wrong.extend("truncated" for p, n in zip(out, full) if len(p.prompt_token_ids) != n)

    def tokenizer_thread() -> None:
        for _ in range(100):
            out = thread_side.tokenize_many(texts, 8)
            wrong.extend("not truncated" for p in out if len(p.prompt_token_ids) != 8)
    threads = [threading.Thread(target=engine_loop), threading.Thread(target=tokenizer_thread)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so any sharing shows
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not wrong, wrong[:5]


def test_async_llm_tunes_malloc_first_and_tokenizes_on_its_own_tokenizer(minilm_dir,
                                                                         monkeypatch):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import cpu_malloc
    callers: list[str] = []
    monkeypatch.setattr(cpu_malloc, "share_heap_across_threads",
                        lambda: callers.append(threading.current_thread().name))
    llm = AsyncLLM.from_engine_args(EngineArgs(model=str(minilm_dir), device="cpu"))
    try:
        # on the caller's thread, before the engine thread's first allocation
        assert callers == [threading.current_thread().name]
        # the CPU platform's serving policies
        assert llm._window is not None and llm._tokenize_between_steps
        assert llm.tokenizer is llm.processor.tokenizer
        assert llm.tokenizer is not llm.engine.tokenizer
        assert llm.tokenizer("a b")["input_ids"] == llm.engine.tokenizer("a b")["input_ids"]
    finally:
        llm.shutdown()


def test_a_bad_request_fails_alone(fake):
    engine, llm = fake

    async def main():
        blocker = await _hold_a_step(engine, llm, "first")
        good = asyncio.ensure_future(llm.encode("p", None, "good"))
        bad = asyncio.ensure_future(llm.encode("p", "bad", "bad"))
        await asyncio.sleep(0.05)
        engine.gate.set()
        return await asyncio.gather(blocker, good, bad, return_exceptions=True)

    first, good, bad = asyncio.run(main())
    assert first.request_id == "first" and good.request_id == "good"
    assert isinstance(bad, ValueError)
    assert llm.is_alive


def test_a_failed_step_fails_its_requests_and_serving_goes_on(fake):
    engine, llm = fake
    engine.failing_steps = 1

    async def main():
        with pytest.raises(RuntimeError, match="device lost"):
            await llm.encode("p", None, "x")
        return await llm.encode("p", None, "y")
    assert asyncio.run(main()).request_id == "y"
    assert llm.is_alive and engine.aborted == ["x"]


def test_a_failed_self_test_marks_dead_and_health_503():
    """A step fails, and so does the short request run alone after it: the engine itself is
    broken. The loop stops, callbacks run (the server exits on them), /health is 503 and
    requests are 500 (upstream's message)."""
    from vllm.entrypoints.openai.api_server import build_app
    engine = FakeEngine()
    engine.failing_steps = 10 ** 6
    llm = AsyncLLM(engine)
    died = threading.Event()
    llm.on_dead(died.set)

    async def main():
        with pytest.raises(RuntimeError):
            await llm.encode("p", None, "x")
        assert died.wait(5) and not llm.is_alive and llm.errored
        with pytest.raises(EngineDeadError):
            await llm.encode("p", None, "y")
        app = build_app(llm, types.SimpleNamespace(served_model_name=["fake"]))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            health = await http.get("/health")
            embed = await http.post("/v1/embeddings", json={"input": "a"})
        return health, embed

    health, embed = asyncio.run(main())
    assert health.status_code == 503
    assert health.json()["error"]["type"] == "ServiceUnavailableError"
    message = embed.json()["error"]["message"]
    # upstream 0.33: a dead engine answers every request 500 with one fixed message
    assert embed.status_code == 500 and embed.json()["error"]["type"] == "InternalServerError"
    assert message == "The server had an error while processing your request."
    assert "RuntimeError" not in message and "device lost" not in message
    late = []
    llm.on_dead(lambda: late.append(1))   # registered after death: called at once
    assert late == [1]
    llm.shutdown()


def test_failed_steps_whose_self_test_passes_keep_serving(fake):
    """Step failures caused by what was in flight (the self-test passes) never stop the
    loop, however many come in a row."""
    engine, llm = fake

    async def main():
        for i in range(5):
            steps = engine.stats.num_steps
            engine.failing_steps = 1
            with pytest.raises(RuntimeError):
                await llm.encode("p", None, f"x{i}")
            while engine.stats.num_steps == steps:  # the self-test's step
                await asyncio.sleep(0.001)
        return await llm.encode("p", None, "y")
    assert asyncio.run(main()).request_id == "y"
    assert llm.is_alive


def test_shutdown_fails_waiting_requests():
    engine = FakeEngine(steps_per_request=10 ** 6)
    llm = AsyncLLM(engine)

    async def main():
        task = asyncio.ensure_future(llm.encode("p", None, "forever"))
        while not engine.batches:
            await asyncio.sleep(0.001)
        await asyncio.get_running_loop().run_in_executor(None, llm.shutdown)
        with pytest.raises(EngineDeadError):
            await task
    asyncio.run(main())
    assert not llm.is_alive


def test_tokenization_runs_off_the_event_loop(fake):
    _, llm = fake

    async def main():
        return await llm.tokenize_prompts(["a", "b"])
    out = asyncio.run(main())
    assert [p for _, p in out] == ["a", "b"]
    assert all(name.startswith("vllm-tokenizer") for name, _ in out)


@pytest.mark.parametrize("inputs", ["a", ["a", "b", "c"]])
def test_http_client_disconnect_aborts_its_request(inputs):
    from test_server import Server
    engine = FakeEngine(steps_per_request=10 ** 9)
    engine.vllm_config.model_config.pooler_config = PoolerConfig(normalize=True)
    llm = AsyncLLM(engine)
    server = Server(llm, served_model_name=["fake"])
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/embeddings", json={"input": inputs}, timeout=0.5)
        expected = 1 if isinstance(inputs, str) else len(inputs)
        for _ in range(300):
            if len(engine.aborted) == expected:
                break
            threading.Event().wait(0.01)
        assert len(engine.aborted) == expected and not engine.running
        assert llm.is_alive
    finally:
        server.close()
        llm.shutdown()


def test_a_quick_answer_never_listens_for_a_disconnect(monkeypatch):
    """The disconnect listener (a task per request) starts only for requests still running
    after DISCONNECT_WATCH_DELAY_S; an answer sent before that never creates one."""
    from test_server import Server
    from vllm.entrypoints.openai import serving_engine
    started = []
    monkeypatch.setattr(serving_engine, "DISCONNECT_WATCH_DELAY_S", 0.1)
    monkeypatch.setattr(serving_engine._DisconnectWatcher, "_listen",
                        lambda self: started.append(self) or asyncio.sleep(0))
    engine = FakeEngine()
    engine.vllm_config.model_config.pooler_config = PoolerConfig(normalize=True)
    llm = AsyncLLM(engine)
    server = Server(llm, served_model_name=["fake"])
    try:
        r = httpx.post(f"{server.url}/v1/embeddings", json={"input": "a"}, timeout=5)
        assert r.status_code == 200
        time.sleep(0.3)
        assert started == []
        engine.gate.clear()  # now a request outlives the delay: its listener starts
        slow = threading.Thread(target=lambda: httpx.post(
            f"{server.url}/v1/embeddings", json={"input": "b"}, timeout=5))
        slow.start()
        for _ in range(100):
            if started:
                break
            time.sleep(0.01)
        assert len(started) == 1
        engine.gate.set()
        slow.join()
    finally:
        server.close()
        llm.shutdown()


def test_submit_many_hands_over_all_prompts_together():
    """One request's prompts reach the engine in one go: its first step holds them all
    (steps start at once here, so a prompt handed over alone would run alone). A duplicate
    id refuses the whole call and registers none."""
    engine = FakeEngine()
    llm = AsyncLLM(engine, arrival_window=None)
    try:
        async def main():
            ids = [f"r-{i}" for i in range(40)]
            outs = await asyncio.gather(*llm.submit_many([("p", None, rid) for rid in ids]))
            assert [o.request_id for o in outs] == ids
            assert engine.batches[0] == sorted(ids)
            with pytest.raises(ValueError, match="'x' is already running"):
                llm.submit_many([("p", None, "x"), ("p", None, "x")])
            assert (await llm.submit_many([("p", None, "x")])[0]).request_id == "x"
        asyncio.run(main())
    finally:
        llm.shutdown()
