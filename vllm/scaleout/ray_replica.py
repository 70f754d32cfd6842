"""The front's handle on a Ray actor replica (`--data-parallel-backend ray`).

Each replica is an async Ray actor holding one `AsyncLLM`; it declares its resources (CPUs
per replica, one GPU on CUDA), so Ray places replicas over the cluster's machines. The front
sends each event-loop pass's requests for a replica as one actor call and awaits it; an
actor that dies (killed, its node lost) fails that call with a RayActorError, which the
front treats as the replica's death (retry elsewhere, restart).
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, Callable, Optional

from vllm.logger import init_logger
from vllm.scaleout.wire import Result, pack_error, pack_future

logger = init_logger(__name__)

START_TIMEOUT_S = 600.0


def connect(address: Optional[str] = None) -> None:
    """Join the Ray cluster at `address` (None: Ray's own RAY_ADDRESS, else a new local
    cluster), unless this process is already connected."""
    import ray

    from vllm import envs
    if ray.is_initialized():
        return
    address = address or envs.get("RAY_ADDRESS")
    ray.init(address=address, include_dashboard=False, logging_level="warning")
    logger.info("Ray: connected to %s (%s CPUs, %s GPUs in the cluster).",
                address or "a new local cluster",
                ray.cluster_resources().get("CPU", 0), ray.cluster_resources().get("GPU", 0))


class ReplicaActor:
    """One engine in a Ray actor (made remote by `RayReplica.start`)."""

    def __init__(self, engine_args: Any, threads: Optional[int]) -> None:
        from vllm.engine.async_llm import AsyncLLM
        if threads:
            import torch
            torch.set_num_threads(threads)
        self.engine = AsyncLLM.from_engine_args(engine_args)

    async def ready(self, warmup: bool = True) -> int:
        """The actor's pid once its engine is warm (`warmup`: run the warm-up first)."""
        if warmup:
            from vllm.engine.warmup import warm_up_and_reset
            await warm_up_and_reset(self.engine, f"Replica (pid {os.getpid()}): ")
        return os.getpid()

    async def run(self, items: list[tuple[str, Any, Any]]) -> list[Result]:
        """Compute these requests (together with any other call's) and return all results;
        aborted ones are left out."""
        results: list[Result] = []
        futures = []
        for request_id, prompt, params in items:
            try:
                futures.append((request_id, self.engine.submit(prompt, params, request_id)))
            except Exception as exc:
                results.append(pack_error(request_id, exc))
        if futures:
            await asyncio.wait([f for _, f in futures])
        results.extend(r for r in (pack_future(rid, f) for rid, f in futures) if r)
        return results

    async def abort(self, request_ids: list[str]) -> None:
        self.engine.abort(request_ids)

    async def stats(self) -> Any:
        return self.engine.stats


class RayReplica:
    """The front's side of one `ReplicaActor`."""

    def __init__(self, index: int, engine_args: Any, cpus: float, gpus: int,
                 on_results: Callable, on_dead: Callable, warmup: bool = True) -> None:
        self.index = index
        self.warmup = warmup
        self.engine_args = engine_args
        self.cpus = cpus
        self.gpus = gpus
        self._on_results = on_results
        self._on_dead = on_dead
        self._dead = False
        self.actor: Any = None

    def start(self) -> None:
        """Create the actor and wait until its engine is loaded and warm (blocking)."""
        import ray
        threads = None if self.gpus else max(1, int(self.cpus))
        remote = ray.remote(ReplicaActor).options(num_cpus=self.cpus, num_gpus=self.gpus,
                                                  max_concurrency=1000)
        self.actor = remote.remote(self.engine_args, threads)
        try:
            self.pid = ray.get(self.actor.ready.remote(self.warmup), timeout=START_TIMEOUT_S)
        except Exception as exc:
            ray.kill(self.actor)
            raise RuntimeError(f"Replica {self.index} failed to start: {exc}") from exc

    def submit(self, items: list[tuple[str, Any, Any]]) -> None:
        asyncio.ensure_future(self._collect(self.actor.run.remote(items), items))

    async def _collect(self, ref: Any, items: list) -> None:
        import ray
        try:
            results = await ref
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError):
            self._died()
            return
        except Exception as exc:  # the call itself failed: fail its requests alone
            results = [pack_error(rid, exc) for rid, _, _ in items]
        self._on_results(self, results)

    def _died(self) -> None:
        if not self._dead:
            self._dead = True
            self._on_dead(self)

    def abort(self, request_ids: list[str]) -> None:
        self.actor.abort.remote(request_ids)

    async def fetch_stats(self) -> Any:
        return await asyncio.wait_for(asyncio.wrap_future(
            self.actor.stats.remote().future()), 5.0)

    def stop(self, timeout: float = 30.0) -> None:
        import ray
        if self.actor is not None:
            ray.kill(self.actor)

    def kill(self) -> None:
        """Kill the actor outright (as a crash would)."""
        import ray
        ray.kill(self.actor, no_restart=True)
