"""TEI's gRPC server: a grpc.aio server in the HTTP server's event loop, serving the same
`ServingTei` (so the same engine, limits and te_* metrics) behind the same API key.

`vllm serve --grpc-port PORT` hands `grpc_companion(args)` to `api_server.run_server`,
which starts it beside uvicorn and stops it after. Every method of tei.proto's services is
registered from the generated descriptors, by its full name (`/tei.v1.Embed/Embed`)."""
from __future__ import annotations

import hmac
from typing import Any, Awaitable, Callable, Optional

from vllm.entrypoints.grpc.stubs import require_grpc, tei_stubs
from vllm.logger import init_logger

logger = init_logger(__name__)

# Seconds the server waits for calls in flight when it stops.
STOP_GRACE_S = 5.0
UNAUTHENTICATED_MESSAGE = "No valid auth token"


def _maker(grpc: Any, client_streaming: bool, server_streaming: bool) -> Callable:
    """grpc's method-handler factory for a method's streaming kind."""
    return {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}[
        (client_streaming, server_streaming)]


def _handler(grpc: Any, method: Any, behaviour: Callable, pb: Any) -> Any:
    """The grpc method handler of one descriptor method, streaming as the proto says."""
    request = getattr(pb, method.input_type.name)
    response = getattr(pb, method.output_type.name)
    make = _maker(grpc, method.client_streaming, method.server_streaming)
    return make(behaviour, request_deserializer=request.FromString,
                response_serializer=response.SerializeToString)


def generic_handlers(grpc: Any, pb: Any, behaviours: dict[str, Callable]) -> list[Any]:
    """One generic handler per tei.v1 service, with every method `behaviours` has."""
    handlers = []
    for service in pb.DESCRIPTOR.services_by_name.values():
        methods = {m.name: _handler(grpc, m, behaviours[f"{service.name}/{m.name}"], pb)
                   for m in service.methods if f"{service.name}/{m.name}" in behaviours}
        handlers.append(grpc.method_handlers_generic_handler(service.full_name, methods))
    return handlers


def _auth_interceptor(grpc: Any, api_key: str) -> Any:
    """Refuse every call without `authorization: Bearer <key>` metadata: UNAUTHENTICATED,
    as TEI answers."""
    expected = f"Bearer {api_key}".encode()

    class ApiKey(grpc.aio.ServerInterceptor):
        async def intercept_service(self, continuation: Callable, details: Any) -> Any:
            given = next((v for k, v in details.invocation_metadata or ()
                          if k == "authorization"), "")
            given = given.encode() if isinstance(given, str) else given
            handler = await continuation(details)
            if handler is None or hmac.compare_digest(given, expected):
                return handler
            return _refusal(grpc, handler)
    return ApiKey()


def _refusal(grpc: Any, handler: Any) -> Any:
    async def refuse(request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
    make = _maker(grpc, handler.request_streaming, handler.response_streaming)
    return make(refuse, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


async def start_tei_grpc(serving: Any, metrics: Any, info: Callable[[], dict], host: str,
                         port: int, api_key: Optional[str] = None,
                         max_message_bytes: Optional[int] = None) -> tuple[Any, int]:
    """Start the server on host:port (0: any free port); returns (server, bound port)."""
    import grpc

    from vllm.entrypoints.grpc.servicer import TeiService
    pb, _ = tei_stubs()
    service = TeiService(serving, metrics, pb, info)
    options = [("grpc.max_receive_message_length", int(max_message_bytes))] \
        if max_message_bytes else []
    interceptors = [_auth_interceptor(grpc, api_key)] if api_key else []
    server = grpc.aio.server(options=options, interceptors=interceptors)
    server.add_generic_rpc_handlers(generic_handlers(grpc, pb, service.behaviours()))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = server.add_insecure_port(address)
    if not bound:
        raise OSError(f"--grpc-port: cannot listen on {address}")
    await server.start()
    return server, bound


def grpc_companion(args: Any) -> Callable[[Any], Callable[[], Awaitable[Callable]]]:
    """For `run_server`: given the app, the coroutine function that starts TEI's gRPC
    service on `--grpc-port` (recording the bound port as `app.state.grpc_port`) and
    returns its stop. Checks now that grpcio is installed (a start-up error otherwise)."""
    require_grpc()
    from vllm.entrypoints.openai.tei_front import tei_info

    def companion(app: Any) -> Callable[[], Awaitable[Callable]]:
        async def start() -> Callable[[], Awaitable[None]]:
            tei = app.state.tei
            host = getattr(args, "host", None) or "127.0.0.1"
            server, port = await start_tei_grpc(
                tei, app.state.metrics.tei, lambda: tei_info(tei, args), host,
                int(args.grpc_port), getattr(args, "api_key", None),
                getattr(args, "max_request_body_bytes", None))
            app.state.grpc_port = port
            logger.info("Serving TEI's gRPC API (tei.v1) on %s:%d", host, port)

            async def stop() -> None:
                await server.stop(STOP_GRACE_S)
            return stop
        return start
    return companion
