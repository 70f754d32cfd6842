"""`vllm run-batch --data-parallel-backend ray`: the batch file sharded with Ray Data over
`--data-parallel-size` actors, each holding one engine behind the server app."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from typing import Any

import numpy as np

from vllm.platforms import resolve_device
from vllm.entrypoints.batch.batch_io import BatchLine, OrderedWriter
from vllm.logger import init_logger

logger = init_logger(__name__)


def start_ray(args: argparse.Namespace) -> Any:
    """Ray, connected (`--ray-address`, RAY_ADDRESS, or a local cluster), keeping order."""
    import ray
    from vllm.scaleout.ray_replica import connect
    connect(getattr(args, "ray_address", None))
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    return ray


def actor_options(args: argparse.Namespace, engine_args: Any) -> tuple[dict, dict]:
    """(map_batches resource options, the actor's threads argument)."""
    cpus = float(args.data_parallel_cpus_per_replica or 1.0)
    cuda = resolve_device(engine_args.device) == "cuda"
    return ({"concurrency": int(args.data_parallel_size or 1), "num_cpus": cpus,
             "num_gpus": 1 if cuda else 0},
            {"threads": None if cuda else max(1, int(cpus))})


class BatchRequestActor:
    """A Ray Data actor: one engine and the server app; answers batches of request lines.

    Batch column in: line (a BatchLine as JSON text); out: output (the output line's
    JSON text)."""

    def __init__(self, engine_args: Any, served_model_name: Any = None,
                 threads: Any = None, concurrency: int = 256) -> None:
        from vllm.engine.async_llm import AsyncLLM
        from vllm.entrypoints.batch.runner import BatchClient
        if threads:
            import torch
            torch.set_num_threads(threads)
        self.loop = asyncio.new_event_loop()
        self.engine = AsyncLLM.from_engine_args(engine_args)
        self.client = BatchClient(self.engine, served_model_name, engine_args.model)
        self.concurrency = concurrency

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        lines = [BatchLine(**json.loads(text)) for text in batch["line"]]
        out: list[str] = []
        self.loop.run_until_complete(self.client.answer_all(
            lines, lambda r: out.append(json.dumps(r, separators=(",", ":"))),
            self.concurrency))
        return {"output": np.array(out, dtype=object)}


def run_jsonl_on_ray(args: argparse.Namespace, engine_args: Any,
                     lines: list[BatchLine]) -> int:
    from tqdm.auto import tqdm
    ray = start_ray(args)
    rows = [{"line": json.dumps(dataclasses.asdict(ln))} for ln in lines]
    resources, extra = actor_options(args, engine_args)
    ds = ray.data.from_items(rows).map_batches(
        BatchRequestActor, batch_format="numpy", batch_size=args.batch_size,
        fn_constructor_kwargs={"engine_args": engine_args,
                               "served_model_name": args.served_model_name,
                               "concurrency": args.max_concurrency, **extra}, **resources)
    writer = OrderedWriter(args.output_file)
    try:
        with tqdm(total=len(rows), desc="run-batch", unit="req", dynamic_ncols=True) as bar:
            for row in (ds.iter_rows() if rows else ()):
                writer.write_raw(row["output"])
                bar.update(1)
    finally:
        writer.close()
    logger.info("Wrote %d line(s) to %s (Ray Data, %d replica(s)).", len(rows),
                args.output_file, resources["concurrency"])
    return 0
