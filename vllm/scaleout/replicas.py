"""Build replica handles for a backend: local processes (mp) or Ray actors (ray)."""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

from vllm import envs
from vllm.logger import init_logger
from vllm.platforms import resolve_device

logger = init_logger(__name__)


def default_threads(size: int, device: str) -> Optional[int]:
    """Threads per replica on CPU: the cores shared out (None on CUDA or when the user
    pinned OpenMP themselves)."""
    if device != "cpu" or envs.is_set("OMP_NUM_THREADS"):
        return None
    return max(1, (os.cpu_count() or 1) // size)


def replica_factory(backend: str, engine_args: Any, size: int, vllm_config: Any, args: Any,
                    front: Callable[[], Any]) -> Callable[[int], Any]:
    """`make(index)` -> an unstarted replica handle whose events reach `front()`."""
    device = resolve_device(engine_args.device)
    # Each replica warms itself up before it reports ready (vllm.engine.warmup).
    warmup = not getattr(args, "no_warmup", False)

    def post(fn: Callable, *a: Any) -> None:
        front().post(fn, *a)

    def on_results(replica: Any, results: list) -> None:
        front().replica_results(replica, results)

    def on_dead(replica: Any) -> None:
        front().replica_died(replica)

    if backend == "mp":
        from vllm.scaleout.mp_replica import MPReplica
        threads = default_threads(size, device)
        if threads:
            logger.info("Each local replica runs torch with %d thread(s) (the CPU's cores "
                        "shared out over %d replicas; set OMP_NUM_THREADS to choose).",
                        threads, size)
        return lambda i: MPReplica(i, engine_args, threads, post, on_results, on_dead,
                                   warmup)
    if backend == "ray":
        from vllm.scaleout.ray_replica import RayReplica, connect
        connect(getattr(args, "ray_address", None))
        cpus = float(getattr(args, "data_parallel_cpus_per_replica", 1.0) or 1.0)
        gpus = 1 if device == "cuda" else 0
        logger.info("Each Ray replica declares %g CPU(s) and %d GPU(s).", cpus, gpus)
        return lambda i: RayReplica(i, engine_args, cpus, gpus, on_results, on_dead, warmup)
    raise ValueError(f"Unknown data-parallel backend {backend!r}; use mp or ray.")
