"""Logging set-up: one `vllm` logger tree with vLLM's line format."""
import logging
import sys

from vllm import envs

_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_configured = False


def _configure_root() -> None:
    global _configured
    if _configured:
        return
    _configured = True
    root = logging.getLogger("vllm")
    if not envs.VLLM_CONFIGURE_LOGGING:
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%m-%d %H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(envs.VLLM_LOGGING_LEVEL)
    root.propagate = False


def init_logger(name: str) -> logging.Logger:
    """Return a logger under the `vllm` tree, configuring the tree once."""
    _configure_root()
    return logging.getLogger(name)
