"""The OpenAI-compatible HTTP server: `build_app(async_llm, args)` and `run_server(args)`."""
from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import stat
from typing import Any, Awaitable, Callable, Optional, Sequence

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response

from vllm import envs
from vllm.engine.async_llm import AsyncLLM
from vllm.engine.protocol import EngineClient
from vllm.engine.warmup import warm_up_and_reset
from vllm.entrypoints.openai import (serving_cohere, serving_invocations, serving_lora,
                                     serving_models, serving_pooling, serving_score,
                                     serving_tei, serving_tokens, tei_front, tei_routes)
from vllm.entrypoints.openai.errors import (OrjsonResponse, error_response,
                                           install_error_handlers)
from vllm.entrypoints.openai.http_edge import (DEFAULT_BODY_READ_TIMEOUT_S,
                                               DEFAULT_MAX_REQUEST_BODY_BYTES, AuthMiddleware,
                                               RequestEdge)
from vllm.entrypoints.openai.metrics import MetricsMiddleware, ServerMetrics
from vllm.entrypoints.openai.serving_engine import COMMON_ROUTES, ROUTE_TASKS, ServingContext
from vllm.entrypoints.openai.serving_limits import ServingLimits
from vllm.entrypoints.openai.tei_protocol import DEFAULT_MAX_CLIENT_BATCH_SIZE
from vllm.entrypoints.openai.tracing import RequestTracer, TraceMiddleware, check_tracing_args
from vllm.logger import init_logger
from vllm.platforms.helper_threads import serial_torch
from vllm.version import __version__

logger = init_logger(__name__)

def build_app(async_llm: Optional[EngineClient], args: Any = None) -> FastAPI:
    """The FastAPI app serving `async_llm` (None: every engine route answers 503).

    `args` is the `vllm serve` namespace or any object with the same attributes;
    missing ones take their defaults (served_model_name, api_key, max_request_body_bytes).
    """
    served = getattr(args, "served_model_name", None)
    if isinstance(served, str):
        served = [served]
    if not served:
        model = getattr(args, "model", None)
        if model is None and async_llm is not None:
            model = async_llm.model_config.model
        served = [str(model or "default")]
    otlp_endpoint = check_tracing_args(args)
    ctx = ServingContext(async_llm, served, limits=ServingLimits.from_args(args))
    metrics = ServerMetrics(lambda: async_llm.stats if async_llm is not None else None,
                            served[0], list(ROUTE_TASKS) +
                            [r.split(" ", 1)[1] for r in COMMON_ROUTES] +
                            list(tei_routes.TEI_PATHS))
    ctx.metrics = metrics

    # Routes that return plain data answer through orjson, as upstream's responses.
    app = FastAPI(title="vLLM (pooling models)", version=__version__,
                  default_response_class=OrjsonResponse)
    app.state.engine = async_llm
    app.state.serving = ctx
    app.state.metrics = metrics
    app.state.tracer = RequestTracer(otlp_endpoint, served[0]) if otlp_endpoint else None
    install_error_handlers(app)
    pooling = serving_pooling.ServingPooling(ctx)
    scores = serving_score.ServingScores(ctx)
    app.include_router(serving_pooling.make_router(pooling))
    app.include_router(serving_score.make_router(scores))
    app.include_router(serving_cohere.make_router(serving_cohere.ServingCohere(pooling)))
    app.include_router(serving_invocations.make_router(pooling, scores))
    app.include_router(serving_tokens.make_router(serving_tokens.ServingTokens(ctx)))
    app.include_router(serving_models.make_router(ctx))
    _add_loras(app, ctx, async_llm, args)

    @app.get("/health")
    async def health() -> Response:
        if async_llm is None:
            return error_response(503, "The engine is not ready yet.")
        if not async_llm.is_alive:
            return error_response(503, str(async_llm.dead_error))
        report = async_llm.health_report()  # data parallel: replicas up
        return OrjsonResponse(report) if report is not None else Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        if async_llm is not None:
            await async_llm.refresh_stats()  # data parallel: ask the replicas
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    tei = serving_tei.ServingTei(pooling, scores, int(
        getattr(args, "max_client_batch_size", None) or DEFAULT_MAX_CLIENT_BATCH_SIZE))
    # TEI's routes sit inside the edge: the API key, metrics and body limits apply to them.
    app.add_middleware(tei_routes.TeiRoutes, serving=tei, metrics=metrics.tei,
                       info=lambda: tei_front.tei_info(tei, args),
                       health=lambda: async_llm is not None and async_llm.is_alive)
    app.state.tei = tei  # TEI's gRPC service (vllm/entrypoints/grpc) answers through it too
    _add_edge(app, ctx, args)
    return app


def _add_loras(app: FastAPI, ctx: ServingContext, async_llm: Optional[EngineClient],
               args: Any) -> None:
    """LoRA adapters: `--lora-modules` served (and checked) from the start; upstream's
    runtime load/unload routes only with VLLM_ALLOW_RUNTIME_LORA_UPDATING."""
    modules = getattr(args, "lora_modules", None) or []
    runtime = envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING
    if modules and not getattr(args, "enable_lora", False):
        raise ValueError("--lora-modules needs --enable-lora.")
    if not (modules or runtime or getattr(args, "enable_lora", False)):
        return
    if async_llm is not None and not async_llm.supports_lora:
        async_llm.check_lora(None)  # says why (data parallel replicas)
    ctx.loras = serving_lora.LoRARegistry(ctx.served_model_names)
    if async_llm is not None:
        serving_lora.load_static(ctx.loras, async_llm, modules)
    if runtime:
        logger.warning("LoRA adapters may be loaded and unloaded at runtime "
                       "(VLLM_ALLOW_RUNTIME_LORA_UPDATING): for trusted clients only.")
        app.include_router(serving_lora.make_router(ctx.loras, async_llm))


def _add_edge(app: FastAPI, ctx: ServingContext, args: Any) -> None:
    """The HTTP edge (`http_edge`), added innermost first."""
    max_bytes = getattr(args, "max_request_body_bytes", None) or DEFAULT_MAX_REQUEST_BODY_BYTES
    timeout = getattr(args, "body_read_timeout", None) or DEFAULT_BODY_READ_TIMEOUT_S
    app.add_middleware(RequestEdge, max_bytes=int(max_bytes), timeout_s=float(timeout),
                       route_error=ctx.route_error,
                       direct=ctx.direct if envs.VLLM_SERVER_DIRECT_ROUTES else None)
    api_key = getattr(args, "api_key", None)
    if api_key:
        app.add_middleware(AuthMiddleware, api_key=api_key)
    app.add_middleware(MetricsMiddleware, metrics=ctx.metrics)
    if app.state.tracer is not None:  # outside the edge: its direct routes are traced too
        app.add_middleware(TraceMiddleware, tracer=app.state.tracer)
    # As upstream: any origin by default, so browsers can call the server.
    app.add_middleware(CORSMiddleware,
                       allow_origins=getattr(args, "allowed_origins", None) or ["*"],
                       allow_methods=getattr(args, "allowed_methods", None) or ["*"],
                       allow_headers=getattr(args, "allowed_headers", None) or ["*"],
                       allow_credentials=bool(getattr(args, "allow_credentials", False)))


# A server that runs beside uvicorn in its event loop (e.g. TEI's gRPC service): started
# before uvicorn, it returns the coroutine function that stops it after uvicorn has stopped.
Companion = Callable[[], Awaitable[Callable[[], Awaitable[None]]]]


class _Server(uvicorn.Server):
    """uvicorn that stops gracefully on SIGINT/SIGTERM and returns instead of re-raising
    the signal, so the engine is shut down and the process exits 0. Its event loop's
    thread runs torch ops without an OpenMP team (`helper_threads`). `companions` run in
    the same event loop, from before uvicorn starts until after it stops."""

    companions: Sequence[Companion] = ()

    async def serve(self, sockets: Optional[list[socket.socket]] = None) -> None:
        with serial_torch():  # the caller's thread: its thread count back on return
            stops = []
            try:
                for start in self.companions:
                    stops.append(await start())
                await super().serve(sockets)
            finally:
                for stop in reversed(stops):
                    await stop()

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self.should_exit:
            logger.info("Received %s; shutting down.", signal.Signals(sig).name)
        super().handle_exit(sig, frame)
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections queue from now on, before uvicorn starts accepting
    sock.set_inheritable(True)
    return sock


def bind_unix_socket(path: str) -> socket.socket:
    """A listening Unix domain socket at `path` (`--uds`). A stale socket file left by a
    server that is gone is replaced; a live server's socket or any other file is refused."""
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise ValueError(f"--uds {path}: the path exists and is not a socket; "
                             "remove it or choose another path.")
        if _socket_answers(path):
            raise ValueError(f"--uds {path}: another server is listening on this socket.")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise ValueError(f"--uds {path}: cannot bind the socket ({exc.strerror}).") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _socket_answers(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def open_listener(args: Any) -> tuple[socket.socket, str]:
    """The server's listening socket and its address for the log: the Unix socket of
    `--uds PATH` (then `--host`/`--port` are ignored, as upstream), else TCP host:port."""
    uds = getattr(args, "uds", None)
    if uds:
        return bind_unix_socket(uds), f"unix:{uds}"
    sock = bind_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if getattr(args, "ssl_certfile", None) else "http"
    return sock, f"{scheme}://{shown}:{port}"


def close_listener(sock: socket.socket, uds: Optional[str] = None) -> None:
    """Close the listening socket (uvicorn may have closed it already) and remove the Unix
    socket's file `uds` that `open_listener` made."""
    sock.close()
    if uds:
        try:
            os.unlink(uds)
        except OSError:
            pass


def warm_up_engine(async_llm: EngineClient, args: Any) -> None:
    """One short batch per served task before the server listens (`--no-warmup` skips
    it), so the first user request does not pay for the first forward pass."""
    if getattr(args, "no_warmup", False):
        logger.info("Warm-up skipped (--no-warmup).")
        return
    if not isinstance(async_llm, AsyncLLM):
        logger.info("Warm-up: each data parallel replica warmed itself up before it "
                    "reported ready (one line per replica above).")
        return
    with serial_torch():  # /metrics then counts users' requests only
        asyncio.run(warm_up_and_reset(async_llm))


def _http_protocol() -> type:
    """uvicorn's fastest HTTP/1.1 protocol here (httptools if installed, else h11), with
    TCP_NODELAY on every connection.

    The protocols write a response's head and body separately; with Nagle on, the body
    waits for the client's (delayed, ~40 ms) ACK of the head on every keep-alive request.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        base = H11Protocol

    class NoDelayProtocol(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport) -> None:  # type: ignore[override]
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            super().connection_made(transport)

    return NoDelayProtocol


def make_server(app: FastAPI, args: Any) -> uvicorn.Server:
    keep_alive = getattr(args, "timeout_keep_alive", None)  # the flag, else the variable
    if keep_alive is None:
        keep_alive = envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE
    config = uvicorn.Config(
        app, log_level=getattr(args, "uvicorn_log_level", "info"),
        access_log=not getattr(args, "disable_uvicorn_access_log", False),
        timeout_keep_alive=int(keep_alive), timeout_graceful_shutdown=30,
        http=_http_protocol(),
        root_path=getattr(args, "root_path", None) or "",
        ssl_keyfile=getattr(args, "ssl_keyfile", None),
        ssl_certfile=getattr(args, "ssl_certfile", None),
        ssl_ca_certs=getattr(args, "ssl_ca_certs", None),
        ssl_cert_reqs=getattr(args, "ssl_cert_reqs", 0))
    return _Server(config)


def freeze_startup_heap() -> None:
    """Move every object alive after start-up (torch, transformers, the app: about 250k
    here) out of the garbage collector's reach, as upstream vLLM does. Requests allocate
    enough containers to trigger an oldest-generation collection every few hundred
    requests; each walked the whole start-up heap, a 150 ms pause with the GIL held that
    stalled every request in flight (serving throughput +5% at 32 clients)."""
    gc.collect()
    gc.freeze()
    logger.info("Garbage collector: %d start-up objects frozen out of collections.",
                gc.get_freeze_count())


def run_server(args: Any, companions: Sequence[Callable[[FastAPI], Companion]] = ()) -> int:
    """Load the engine, then serve until SIGINT/SIGTERM; always shut the engine down (one
    model; `vllm serve` hands several to `multi_server.run_multi_server`). `companions`:
    for each, `companion(app)` is started beside uvicorn (`vllm serve --grpc-port`).
    Returns the process exit status: 0, or 1 when the engine died (its requests in flight
    were answered 503 first), so that a supervisor restarts the server, as upstream."""
    from vllm.entrypoints.openai.cli_args import engine_args_from_namespace
    from vllm.scaleout.engine import make_async_engine
    check_tracing_args(args)  # a missing `otel` extra stops us before the model loads
    engine_args = engine_args_from_namespace(args)
    async_llm = make_async_engine(engine_args, args)
    sock, app = None, None
    try:
        app = build_app(async_llm, args)
        warm_up_engine(async_llm, args)
        freeze_startup_heap()
        sock, address = open_listener(args)
        logger.info("Serving model %s as %s", async_llm.model_config.model,
                    ", ".join(app.state.serving.served_model_names))
        logger.info("Supported tasks: %s; routes: %s", list(async_llm.model_config.supported_tasks),
                    ", ".join(app.state.serving.served_routes()))
        logger.info("Listening on %s", address)
        server = make_server(app, args)
        server.companions = [companion(app) for companion in companions]
        async_llm.on_dead(lambda: _exit_after_engine_death(server))
        server.run(sockets=[sock])
    finally:
        if sock is not None:
            close_listener(sock, getattr(args, "uds", None))
        async_llm.shutdown()
        if app is not None and app.state.tracer is not None:
            app.state.tracer.shutdown()  # the spans still batched are sent
        logger.info("Server stopped.")
    return 1 if async_llm.errored else 0


def _exit_after_engine_death(server: uvicorn.Server) -> None:
    logger.error("The engine died; the server stops (exit status 1) so that it is restarted.")
    server.should_exit = True  # uvicorn's main loop reads it; in-flight answers drain


if __name__ == "__main__":
    # Upstream's older entry point: `python -m vllm.entrypoints.openai.api_server --model M`
    # takes the same flags as `vllm serve`. (A program's entry, above every layer: the
    # layering test reads no `__main__` block.)
    import sys

    from vllm.entrypoints.cli.main import main
    sys.exit(main(["serve", *sys.argv[1:]]))
