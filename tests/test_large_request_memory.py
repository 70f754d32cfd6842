"""A request of many inputs is held in memory proportional to its answer, not more
(issue 17 item 4; the profile is benchmarks/bench_memory_large.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.model_factory import hf_hidden_states


def _own_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def test_all_pooling_outputs_do_not_pin_the_step_buffer(shared_llm, bert_embed_dir):
    """ALL pooling without a head answers each prompt's rows of the step's hidden states.
    A view would keep the whole step's buffer alive for as long as any one output lives."""
    llm = shared_llm(bert_embed_dir, override_pooler_config={"pooling_type": "ALL"})
    texts = ["a short one", "a somewhat longer text than the first", "third"]
    outs = llm.encode(texts, use_tqdm=False)
    for out in outs:
        data = out.outputs.data
        assert data.untyped_storage().nbytes() == _own_bytes(data)
        want = hf_hidden_states(bert_embed_dir, out.prompt_token_ids)
        np.testing.assert_allclose(data.numpy(), want.numpy(), atol=1e-4)


# A request this size is streamed (more than STREAM_MIN_ITEMS items) and runs many steps.
N_INPUTS = 600
MAX_NUM_SEQS = 8


@pytest.fixture(scope="module")
def small_steps(bert_embed_dir):
    """A tiny BERT served with steps of at most MAX_NUM_SEQS prompts."""
    from tests.servers import _model_server
    yield from _model_server(bert_embed_dir, max_num_seqs=MAX_NUM_SEQS)


def _watch_waiting(engine) -> list[int]:
    """Record the engine's waiting queue before each step (on the engine thread)."""
    seen: list[int] = []
    inner = engine.engine.step

    def step():
        seen.append(engine.engine.num_waiting)
        return inner()
    engine.engine.step = step
    return seen


def test_a_large_request_waits_untokenized_outside_the_engine(small_steps, bert_embed_dir):
    """The engine holds at most BACKLOG_STEPS steps' worth of waiting prompts; the rest of
    a 600-input request waits as text. Every answer is still right, in order."""
    from vllm.engine.async_llm import BACKLOG_STEPS
    from tests.model_factory import hf_embedding, hf_tokenizer
    texts = [f"text {i} of a long list" for i in range(N_INPUTS)]
    seen = _watch_waiting(small_steps.engine)
    try:
        r = small_steps.post("/v1/embeddings", {"input": texts})
    finally:
        del small_steps.engine.engine.step
    assert r.status_code == 200, r.text[:300]
    data = r.json()["data"]
    assert [d["index"] for d in data] == list(range(N_INPUTS))
    assert len(seen) >= N_INPUTS // MAX_NUM_SEQS and max(seen) <= BACKLOG_STEPS * MAX_NUM_SEQS
    tok = hf_tokenizer(bert_embed_dir)
    for i in (0, 317, N_INPUTS - 1):
        want = hf_embedding(bert_embed_dir, tok(texts[i])["input_ids"], "CLS")
        np.testing.assert_allclose(data[i]["embedding"], want.numpy(), atol=1e-5)


def test_a_large_request_holds_little_python_heap_per_input(small_steps):
    """The Python heap a 600-input request adds at its peak, per input (tracemalloc over
    every thread: the server's loop, the engine thread, this client). What an input must
    hold while in flight: its text, future and pending entry (~0.7 KiB), its output (the
    request output objects and a tensor's Python side, ~0.6 KiB), plus streaming one JSON
    item at a time. Measured 2.1 KiB; before the bounded backlog, every input was also a
    tokenized engine request with dedup and scheduler state (3.2 KiB), and an answer held
    whole as JSON floats would add 64 x 24 B + the JSON text (~2.5 KiB) per input."""
    import gc
    import json
    import tracemalloc
    body = json.dumps({"input": [f"entry {i} in a list" for i in range(N_INPUTS)]}).encode()
    headers = {"content-type": "application/json"}
    small_steps.client.post("/v1/embeddings", content=body, headers=headers)  # warm-up
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with small_steps.client.stream("POST", "/v1/embeddings", content=body,
                                       headers=headers) as r:
            assert r.status_code == 200
            size = sum(len(chunk) for chunk in r.iter_raw(65536))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert size > N_INPUTS * 64 * 8  # the whole answer arrived (64 floats per item)
    assert peak / N_INPUTS < 2600, f"{peak / N_INPUTS:.0f} B per input"
