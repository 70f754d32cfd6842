"""`vllm serve DIR_A DIR_B ... --served-model-name NAME_A NAME_B`: several models, one port.

Every model is served as it would be alone (`build_app` over its own engine, the engine
flags applied to each); `ModelRouter` routes requests by their `model`. Before any model
loads, `model_memory` estimates what each takes and refuses a set that cannot fit.
"""
from __future__ import annotations

import argparse
import copy
from typing import Any

from vllm.entrypoints.openai.model_memory import check_fits, estimate
from vllm.entrypoints.openai.multi_model import ModelRouter
from vllm.logger import init_logger

logger = init_logger(__name__)


def model_namespaces(args: argparse.Namespace, models: list[str]) -> list[argparse.Namespace]:
    """One `vllm serve` namespace per model, each with its one served name (the directory
    when no names are given)."""
    names = getattr(args, "served_model_name", None) or list(models)
    if len(names) != len(models):
        raise SystemExit(f"{len(models)} models need {len(models)} --served-model-name values "
                         f"(one each, in order); got {len(names)}.")
    if len(set(names)) != len(names):
        raise SystemExit(f"--served-model-name values must differ; got {names}.")
    out = []
    for model, name in zip(models, names):
        ns = copy.copy(args)
        ns.model_tag, ns.model, ns.served_model_name = model, None, [name]
        out.append(ns)
    return out


def run_multi_server(args: argparse.Namespace, models: list[str]) -> int:
    """Load every model, serve them all until SIGINT/SIGTERM, shut every engine down."""
    from vllm.entrypoints.openai.api_server import (build_app, close_listener,
                                                    freeze_startup_heap, make_server,
                                                    open_listener, warm_up_engine)
    from vllm.entrypoints.openai.cli_args import engine_args_from_namespace
    from vllm.entrypoints.openai.http_edge import (DEFAULT_BODY_READ_TIMEOUT_S,
                                                   DEFAULT_MAX_REQUEST_BODY_BYTES)
    from vllm.scaleout.engine import make_async_engine
    spaces = model_namespaces(args, models)
    engine_args = [engine_args_from_namespace(ns) for ns in spaces]
    check_fits([estimate(ns.served_model_name[0], ea.create_engine_config())
                for ns, ea in zip(spaces, engine_args)])
    engines: list[Any] = []
    sock = None
    try:
        for ns, ea in zip(spaces, engine_args):
            engines.append(make_async_engine(ea, ns))
            logger.info("Serving model %s as %s", ns.model, ns.served_model_name[0])
        router = ModelRouter(
            [(ns.served_model_name, build_app(engine, ns)) for ns, engine in
             zip(spaces, engines)],
            int(getattr(args, "max_request_body_bytes", None) or
                DEFAULT_MAX_REQUEST_BODY_BYTES),
            float(getattr(args, "body_read_timeout", None) or DEFAULT_BODY_READ_TIMEOUT_S))
        for engine in engines:
            warm_up_engine(engine, args)
        freeze_startup_heap()
        sock, address = open_listener(args)
        logger.info("Listening on %s (%d models)", address, len(engines))
        server = make_server(router, args)
        for engine in engines:
            engine.on_dead(lambda: setattr(server, "should_exit", True))
        server.run(sockets=[sock])
    finally:
        if sock is not None:
            close_listener(sock, getattr(args, "uds", None))
        for engine in engines:
            engine.shutdown()
        logger.info("Server stopped.")
    return 1 if any(e.errored for e in engines) else 0
