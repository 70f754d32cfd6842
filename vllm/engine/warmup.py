"""Start-up warm-up: one short batch per task the model serves, run through the serving
engine before the server accepts its first connection.

The first forward pass of a process pays for lazy work (the engine thread's OpenMP team,
oneDNN/cuBLAS kernel selection, allocator growth, the tokenizer thread); without a warm-up
the first user request carries it. Each batch holds two short prompts of different lengths,
so the batched (varlen) path runs, not only the one-prompt path.

Warm-up prompts carry a cache salt of their own (a fresh one per start): their KV blocks
can never be a prefix-cache hit for a user's request, so no user sees cached tokens they did
not send. (Caching is exact, so the numbers could not change anyway.) The server resets the
engine's counters after the warm-up (`AsyncLLM.reset_stats`), so `/metrics` counts users'
requests only; the warm-up never reaches HTTP, so no route's metrics count it either.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from vllm.logger import init_logger
from vllm.pooling_params import PoolingParams
from vllm.tasks import PoolingTask

logger = init_logger(__name__)

# Two prompts of different lengths, both short enough to stay inside one KV block.
WARMUP_TEXTS = ("warm up", "a short warm-up batch")
WARMUP_PAIR = ("warm up", "a short warm-up document")


@dataclass
class WarmupReport:
    """What the warm-up ran: the tasks warmed, those that failed (task -> error) and the
    seconds it took."""

    tasks: list[str]
    failed: dict[str, str]
    seconds: float

    def describe(self) -> str:
        done = [t for t in self.tasks if t not in self.failed]
        text = (f"Warm-up: {len(done)} batch(es) of {len(WARMUP_TEXTS)} prompts "
                f"({', '.join(done) or 'none'}) in {self.seconds:.2f} s")
        if self.failed:
            text += "; failed: " + "; ".join(f"{t}: {e}" for t, e in self.failed.items())
        return text + "."


def warmup_tasks(model_config: Any) -> list[str]:
    """The distinct heads the model serves, in its task order. `encode` runs as the engine's
    `encode_task` (a token classifier's /pooling runs its token task); `score` is its own
    batch only on a cross-encoder (pairs through the classifier head); an embedding model
    scores with its embed head, already warmed."""
    tasks: list[str] = []
    for task in model_config.supported_tasks:
        if task == PoolingTask.ENCODE:
            task = model_config.encode_task
        if task == PoolingTask.SCORE and not model_config.is_cross_encoder:
            continue
        if task not in tasks:
            tasks.append(task)
    return tasks


async def _prompts(client: Any, task: str, salt: str) -> list[Any]:
    """The task's warm-up prompts, tokenized on the tokenizer thread, salted."""
    if task == PoolingTask.SCORE:
        prompts = await client.tokenize_pairs([WARMUP_PAIR, WARMUP_PAIR[::-1]], None)
    else:
        prompts = await client.tokenize_prompts(list(WARMUP_TEXTS))
    return [replace(p, cache_salt=salt) for p in prompts]


async def _run_task(client: Any, task: str, salt: str) -> None:
    params = PoolingParams()
    params.verify(task, client.model_config)
    prompts = await _prompts(client, task, salt)
    base = f"vllm-warmup-{task}-{uuid.uuid4().hex[:8]}"
    items = [(p, params.clone(), f"{base}-{i}") for i, p in enumerate(prompts)]
    for future in client.submit_many(items):
        await future


async def warm_up(client: Any) -> WarmupReport:
    """Run one short batch per task through `client` (an `EngineClient`), one task after
    the other. A task that fails is reported, not raised: the server still starts (the
    first request of that task then fails or is slow as it would have been)."""
    start = time.perf_counter()
    salt = f"vllm-warmup-{uuid.uuid4().hex}"
    tasks = warmup_tasks(client.model_config)
    failed: dict[str, str] = {}
    for task in tasks:
        try:
            await _run_task(client, task, salt)
        except Exception as exc:  # reported in the log line; start-up goes on
            failed[str(task)] = f"{type(exc).__name__}: {exc}"
    return WarmupReport([str(t) for t in tasks], failed, time.perf_counter() - start)


async def warm_up_and_reset(client: Any, who: str = "") -> WarmupReport:
    """`warm_up`, then, when every task succeeded, the engine's counters from zero (so
    /metrics counts users' requests only); one log line, `who` naming the engine (a data
    parallel replica warms itself this way before it reports ready)."""
    report = await warm_up(client)
    if not report.failed:
        client.reset_stats()
    (logger.warning if report.failed else logger.info)("%s%s", who, report.describe())
    return report
