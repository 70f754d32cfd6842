"""`vllm run-batch`: read the input, run it where the flags say, write the output."""
from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from tqdm.auto import tqdm

from vllm.entrypoints.batch.batch_io import OrderedWriter, pending_lines, resume_state
from vllm.entrypoints.batch.runner import BatchClient
from vllm.logger import init_logger

logger = init_logger(__name__)


def is_parquet(path: str) -> bool:
    """A Parquet file or a directory of them (a corpus), rather than a JSONL batch file."""
    return path.endswith(".parquet") or os.path.isdir(path)


def run_batch(args: argparse.Namespace) -> int:
    """Entry point of `vllm run-batch` (flags: see cli_args.make_run_batch_parser)."""
    from vllm.entrypoints.openai.cli_args import engine_args_from_namespace
    engine_args = engine_args_from_namespace(args)
    ray = args.data_parallel_backend == "ray"
    if is_parquet(args.input_file):
        from vllm.entrypoints.batch import corpus
        if ray:
            return corpus.run_on_ray(args, engine_args)
        return corpus.run_local(args, engine_args)
    done, written = resume_state(args.output_file)
    lines = pending_lines(args.input_file, done, written)
    if done or written:
        logger.info("Resuming %s: %d line(s) already written, %d to run.",
                    args.output_file, written, len(lines))
    if ray:
        from vllm.entrypoints.batch import ray_data
        return ray_data.run_jsonl_on_ray(args, engine_args, lines)
    asyncio.run(_run_local(args, engine_args, lines))
    return 0


async def _run_local(args: argparse.Namespace, engine_args: Any, lines: list) -> None:
    from vllm.scaleout.engine import make_async_engine
    engine = make_async_engine(engine_args, args)
    writer = OrderedWriter(args.output_file)
    client = BatchClient(engine, args.served_model_name, args.model)
    bar = tqdm(total=len(lines), desc="run-batch", unit="req", dynamic_ncols=True)

    def emit(record: dict) -> None:
        writer.write(record)
        bar.update(1)
    try:
        await client.answer_all(lines, emit, args.max_concurrency)
    finally:
        bar.close()
        writer.close()
        await client.aclose()
        engine.shutdown()
    logger.info("Wrote %d line(s) to %s.", len(lines), args.output_file)
