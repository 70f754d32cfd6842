"""Parquet corpora: a text column in, the same rows plus an embedding column out.

`EmbeddingPredictor` is the building block: one engine per instance, called on a batch of
rows (a pyarrow Table) and returning it with an embedding column. `vllm run-batch` runs it
over the file locally, or as the actor class of Ray Data's `map_batches`; users can put it
in their own pipelines the same way:

    import ray
    from vllm.entrypoints.batch.corpus import EmbeddingPredictor
    ds = ray.data.read_parquet("s3://bucket/corpus/")
    ds = ds.map_batches(EmbeddingPredictor, fn_constructor_kwargs={"model": "BAAI/bge-m3"},
                        batch_format="pyarrow", batch_size=1024, concurrency=8, num_cpus=4)
    ds.write_parquet("s3://bucket/embeddings/")
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Optional

import numpy as np

from vllm.logger import init_logger

logger = init_logger(__name__)


class EmbeddingPredictor:
    """Embeds `input_column` of each batch into `output_column` (fixed-size float32 lists).

    `model` and `engine_kwargs` are `LLM(...)`'s arguments; or pass a ready `engine_args`
    (`vllm run-batch` does). `threads` pins torch's thread count (one replica per CPU slice).
    """

    def __init__(self, model: Optional[str] = None, *, input_column: str = "text",
                 output_column: str = "embedding", engine_args: Any = None,
                 threads: Optional[int] = None, **engine_kwargs: Any) -> None:
        from vllm.entrypoints.llm import LLM
        if threads:
            import torch
            torch.set_num_threads(threads)
        if engine_args is not None:
            kwargs = {f.name: getattr(engine_args, f.name)
                      for f in dataclasses.fields(engine_args)}
            model = kwargs.pop("model")
            engine_kwargs = {**kwargs, **engine_kwargs}
        if model is None:
            raise ValueError("EmbeddingPredictor needs a model (or engine_args).")
        self.llm = LLM(model, **engine_kwargs)
        self.input_column = input_column
        self.output_column = output_column

    def embed(self, texts: list[str]) -> np.ndarray:
        """[len(texts), dim] float32 embeddings, exactly as `LLM.embed` computes them."""
        import torch
        outs = self.llm.encode(texts, pooling_task="embed", use_tqdm=False)
        return torch.stack([o.outputs.data for o in outs]).numpy()

    def __call__(self, batch: Any) -> Any:
        """A pyarrow Table in, the same Table plus the embedding column out."""
        import pyarrow as pa
        if self.input_column not in batch.column_names:
            raise ValueError(f"The input has no column {self.input_column!r} (it has "
                             f"{batch.column_names}); pass --input-column.")
        vectors = self.embed([str(t) for t in batch.column(self.input_column).to_pylist()])
        column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)),
                                                   vectors.shape[1])
        return batch.append_column(self.output_column, column)


def run_local(args: argparse.Namespace, engine_args: Any) -> int:
    """Embed a Parquet file or directory into one Parquet file, batch by batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tqdm.auto import tqdm
    table = pq.read_table(args.input_file)
    predictor = EmbeddingPredictor(engine_args=engine_args, input_column=args.input_column,
                                   output_column=args.output_column)
    parts = []
    with tqdm(total=table.num_rows, desc="run-batch", unit="row", dynamic_ncols=True) as bar:
        for start in range(0, table.num_rows, args.batch_size):
            parts.append(predictor(table.slice(start, args.batch_size)))
            bar.update(parts[-1].num_rows)
    pq.write_table(pa.concat_tables(parts) if parts else table, args.output_file)
    logger.info("Wrote %d row(s) with column %r to %s.", table.num_rows, args.output_column,
                args.output_file)
    return 0


def run_on_ray(args: argparse.Namespace, engine_args: Any) -> int:
    """Embed with Ray Data: `--data-parallel-size` EmbeddingPredictor actors; the output is
    a Parquet directory written by Ray Data (one file per block)."""
    from vllm.entrypoints.batch.ray_data import actor_options, start_ray
    ray = start_ray(args)
    ds = ray.data.read_parquet(args.input_file)
    ds = ds.map_batches(EmbeddingPredictor, batch_format="pyarrow",
                        batch_size=args.batch_size,
                        fn_constructor_kwargs={"engine_args": engine_args,
                                               "input_column": args.input_column,
                                               "output_column": args.output_column,
                                               **actor_options(args, engine_args)[1]},
                        **actor_options(args, engine_args)[0])
    ds.write_parquet(args.output_file)
    logger.info("Wrote the embeddings (column %r) under %s.", args.output_column,
                args.output_file)
    return 0
