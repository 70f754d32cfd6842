"""`vllm` console script: `vllm --version`, `vllm serve [MODEL] [flags]`,
`vllm run-batch -i INPUT -o OUTPUT --model MODEL`."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from vllm.logger import init_logger
from vllm.version import __version__

logger = init_logger("vllm.entrypoints.cli.main")  # also when run as __main__

# Iterations an idle OpenMP thread spins before it sleeps when serving: ~0.3 ms here,
# against libgomp's default 300k (~9 ms).
SERVE_OMP_SPIN_COUNT = 10000


def limit_openmp_spin() -> bool:
    """Before torch loads, let the server's idle OpenMP threads sleep after ~0.3 ms.

    Between steps the server answers the step's requests and reads the next ones while the
    engine's OpenMP worker has no work; spinning for libgomp's default ~9 ms it held one of
    the cores that work needs. Inside a forward pass the gaps between parallel regions are
    microseconds, so the shorter spin still covers them. An explicit GOMP_SPINCOUNT or
    OMP_WAIT_POLICY is kept; False when one is set or torch is already loaded."""
    if "torch" in sys.modules or "GOMP_SPINCOUNT" in os.environ or \
            "OMP_WAIT_POLICY" in os.environ:
        return False
    os.environ["GOMP_SPINCOUNT"] = str(SERVE_OMP_SPIN_COUNT)
    logger.info("OpenMP: idle threads spin %d iterations before sleeping, not libgomp's "
                "300000, so they leave the cores to HTTP work between steps (set "
                "GOMP_SPINCOUNT to choose).", SERVE_OMP_SPIN_COUNT)
    return True


def _serve(args: argparse.Namespace) -> int:
    from vllm.entrypoints.openai.api_server import run_server
    return run_server(args)


def _run_batch(args: argparse.Namespace) -> int:
    from vllm.entrypoints.batch.run_batch import run_batch
    return run_batch(args)


def make_parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.openai.cli_args import make_serve_parser
    parser = argparse.ArgumentParser(
        prog="vllm", description="vLLM-compatible engine for pooling models (embeddings, "
        "classifiers, rerankers, reward models).")
    parser.add_argument("-v", "--version", action="version", version=__version__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="Start the OpenAI-compatible HTTP server.",
        description="Serve a pooling model over HTTP: /v1/embeddings, /pooling, /classify, "
        "/score, /rerank, /tokenize, /detokenize, /v1/models, /health, /version, /metrics.")
    make_serve_parser(serve)
    serve.set_defaults(handler=_serve)
    from vllm.entrypoints.batch.cli_args import make_run_batch_parser
    batch = commands.add_parser(
        "run-batch", help="Run a batch file (OpenAI batch format) or a Parquet corpus.",
        description="Answer every line of a JSONL batch file (upstream's format: "
        "{custom_id, method, url, body}) as the server would, or embed a Parquet corpus.")
    make_run_batch_parser(batch)
    batch.set_defaults(handler=_run_batch)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    if (sys.argv[1:] if argv is None else argv)[:1] in (["serve"], ["run-batch"]):
        limit_openmp_spin()
    parser = make_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        return 0
    except ValueError as exc:  # engine configuration refused (bad flag value, bad model)
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
