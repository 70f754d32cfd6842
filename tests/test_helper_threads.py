"""The server's helper threads start no OpenMP team beside the engine's
(vllm/platforms/helper_threads.py): a second team made libgomp's workers sleep between the
engine's parallel regions for the rest of the server's life."""
from __future__ import annotations

import base64
import os
import threading

import numpy as np
import torch
from servers import Server, _engine

from vllm.platforms.helper_threads import serial_torch, serial_torch_here

WORDS = "word " * 120  # MiniLM: 122 tokens x 384 > torch's 32768-element grain: a parallel cast


def native_only_threads() -> int:
    """Threads of this process that Python did not start (OpenMP workers among them)."""
    python = {t.native_id for t in threading.enumerate()}
    return sum(1 for tid in os.listdir("/proc/self/task") if int(tid) not in python)


def _threads_while_helper_alive(guard: bool) -> tuple[int, int]:
    """(native-only threads, the helper's torch thread count) while a helper thread that
    ran parallel-sized torch ops is still alive."""
    ready, release, seen = threading.Event(), threading.Event(), []

    def helper() -> None:
        if guard:
            serial_torch_here()
        x = torch.randn(400, 384)
        for _ in range(5):
            x.to(torch.bfloat16)
            torch.add(x, x)
        seen.append(torch.get_num_threads())
        ready.set()
        release.wait()
    thread = threading.Thread(target=helper)
    thread.start()
    ready.wait()
    try:
        return native_only_threads(), seen[0]
    finally:
        release.set()
        thread.join()


def test_a_serial_helper_thread_starts_no_openmp_team():
    torch.add(torch.ones(400_000), 1)  # this thread's own team exists first
    before, ours = native_only_threads(), torch.get_num_threads()
    count, helper_threads = _threads_while_helper_alive(guard=True)
    assert helper_threads == 1 and count <= before
    assert torch.get_num_threads() == ours  # only the helper thread went serial
    if torch.get_num_threads() > 1:  # unguarded, the same work adds a team's worker(s)
        count, helper_threads = _threads_while_helper_alive(guard=False)
        assert helper_threads > 1 and count > before


def test_a_borrowed_thread_gets_its_thread_count_back():
    """`serial_torch()` (the caller's thread, lent to uvicorn or the start-up adapter check):
    serial inside, the caller's own count again after, even when the body raised."""
    seen: list[tuple[int, int, int]] = []

    def borrowed() -> None:
        before = torch.get_num_threads()
        try:
            with serial_torch():
                inside = torch.get_num_threads()
                raise KeyError("the body fails")
        except KeyError:
            pass
        seen.append((before, inside, torch.get_num_threads()))
    thread = threading.Thread(target=borrowed)
    thread.start()
    thread.join()
    before, inside, after = seen[0]
    assert (inside, after) == (1, before)
    assert before == torch.get_num_threads()  # a new thread starts at the process's count


def test_serving_token_outputs_starts_no_second_openmp_team(minilm_dir):
    """bfloat16 token outputs cast on the event loop (one item) and on AnyIO's worker
    threads (a streamed list of 300): the process's OpenMP threads stay as they were."""
    engine = _engine(minilm_dir, pooler_config={"task": "token_embed"})
    server = Server(engine)
    try:
        warm = server.post("/pooling", {"input": WORDS})
        assert warm.status_code == 200, warm.text
        before = native_only_threads()
        one = server.post("/pooling", {"input": WORDS, "encoding_format": "base64",
                                       "embed_dtype": "bfloat16"})
        assert one.status_code == 200, one.text
        bits = np.frombuffer(base64.b64decode(one.json()["data"][0]["data"]), np.int16)
        floats = torch.from_numpy(bits.copy()).view(torch.bfloat16).float().reshape(-1, 384)
        ref = torch.tensor(warm.json()["data"][0]["data"])
        assert floats.shape == ref.shape and (floats - ref).abs().max() < 1e-2
        many = server.post("/pooling", {"input": [WORDS] * 300, "embed_dtype": "float16"})
        assert many.status_code == 200 and len(many.json()["data"]) == 300
        assert native_only_threads() <= before  # no OpenMP worker was added
    finally:
        server.close()
        engine.shutdown()
