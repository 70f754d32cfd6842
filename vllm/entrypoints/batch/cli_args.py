"""`vllm run-batch` flags: input/output, the engine's flags, data parallelism."""
from __future__ import annotations

import argparse

from vllm.entrypoints.batch.runner import DEFAULT_CONCURRENCY
from vllm.entrypoints.dp_args import add_data_parallel_flags
from vllm.entrypoints.openai.cli_args import _add_compat_flags, _add_engine_flags


def make_run_batch_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    io = parser.add_argument_group("batch")
    io.add_argument("-i", "--input-file", required=True,
                    help="A JSONL batch file (one {custom_id, method, url, body} per line), "
                    "or a Parquet file or directory of texts (see --input-column).")
    io.add_argument("-o", "--output-file", required=True,
                    help="JSONL output (one line per input line, input order; rerunning "
                    "with the same file resumes), or a Parquet file for Parquet input.")
    io.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                    help="Model name(s) accepted in the bodies' `model` field.")
    io.add_argument("--max-concurrency", type=int, default=DEFAULT_CONCURRENCY,
                    help="Lines in flight at once (default %(default)s).")
    io.add_argument("--input-column", default="text",
                    help="Parquet input: the column of texts to embed (default text).")
    io.add_argument("--output-column", default="embedding",
                    help="Parquet output: the column the embeddings go to (default embedding).")
    io.add_argument("--batch-size", type=int, default=1024,
                    help="Parquet / Ray: rows handed to an engine at once (default 1024).")
    _add_engine_flags(parser)
    add_data_parallel_flags(parser)
    _add_compat_flags(parser)
    return parser
