"""`vllm` console script: `vllm --version`, `vllm serve [MODEL] [flags]`,
`vllm run-batch -i INPUT -o OUTPUT --model MODEL`."""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from vllm.logger import init_logger
from vllm.platforms.process import limit_openmp_spin
from vllm.version import __version__

logger = init_logger("vllm.entrypoints.cli.main")  # also when run as __main__

def _serve(args: argparse.Namespace) -> int:
    models = getattr(args, "model_tag", None)
    grpc = getattr(args, "grpc_port", None) is not None
    if isinstance(models, list) and len(models) > 1:  # several models on one port
        if getattr(args, "model", None):
            raise SystemExit("Give the models as MODEL arguments only, without --model.")
        if grpc:
            raise SystemExit("--grpc-port serves one model (TEI's gRPC API has no model "
                             "field); start one server per model.")
        from vllm.entrypoints.openai.multi_server import run_multi_server
        return run_multi_server(args, models)
    from vllm.entrypoints.openai.api_server import run_server
    return run_server(args, _grpc_companions(args) if grpc else ())


def _grpc_companions(args: argparse.Namespace) -> list:
    """TEI's gRPC service beside the HTTP server; no grpcio is a start-up error, before the
    model loads."""
    from vllm.entrypoints.grpc.server import grpc_companion
    try:
        return [grpc_companion(args)]
    except ImportError as exc:
        raise SystemExit(f"error: {exc}") from None


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


def _asks_for_cuda(argv: list[str]) -> bool:
    """`--device cuda[:N]` on the command line (read before torch loads)."""
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--device=") else \
            (argv[i + 1] if arg == "--device" and i + 1 < len(argv) else "")
        if value.startswith("cuda"):
            return True
    return False


def main(argv: Optional[list[str]] = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if words[:1] in (["serve"], ["run-batch"]) and not _asks_for_cuda(words):
        limit_openmp_spin()  # a CPU serving policy; set before torch loads
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
