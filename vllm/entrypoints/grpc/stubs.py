"""The Python stubs of tei.proto, generated with grpcio-tools on first use (never committed).

`protoc` runs once per proto content and tool version into
`$XDG_CACHE_HOME/vllm/grpc/<hash>/` (a temporary folder where the cache is not writable);
the two generated modules are loaded from there as `vllm.entrypoints.grpc.tei_pb2` and
`..tei_pb2_grpc`, without touching sys.path. grpcio and grpcio-tools are optional: a missing
one is an ImportError that names the `grpc` extra.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import pathlib
import shutil
import sys
import tempfile
import types
from typing import Optional

from vllm import envs

PROTO = pathlib.Path(__file__).with_name("tei.proto")
PACKAGE = "vllm.entrypoints.grpc"
INSTALL_HINT = 'pip install -e ".[grpc]"  (grpcio and grpcio-tools)'
_loaded: Optional[tuple[types.ModuleType, types.ModuleType]] = None


def require_grpc() -> None:
    """Raise ImportError naming the extra unless grpcio and grpcio-tools import."""
    missing = [name for name in ("grpc", "grpc_tools")
               if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"--grpc-port needs grpcio and grpcio-tools ({', '.join(missing)} "
                          f"not installed): {INSTALL_HINT}")


def _cache_root() -> pathlib.Path:
    base = envs.XDG_CACHE_HOME or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "vllm" / "grpc"


def _key() -> str:
    """The proto's content and the generator's and runtime's versions."""
    import google.protobuf
    import grpc_tools
    from importlib.metadata import version
    parts = [PROTO.read_bytes(), version("grpcio-tools").encode(),
             google.protobuf.__version__.encode(), str(grpc_tools.__file__).encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _generate(dest: pathlib.Path) -> None:
    """protoc into a fresh folder beside `dest`, then renamed into place (atomic: a
    concurrent server either finds the whole pair or generates its own)."""
    from grpc_tools import protoc
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="gen-", dir=dest.parent))
    try:
        src = work / "src" / PACKAGE.replace(".", "/")
        src.mkdir(parents=True)
        shutil.copy2(PROTO, src / PROTO.name)
        include = pathlib.Path(protoc.__file__).parent / "_proto"
        relative = f"{PACKAGE.replace('.', '/')}/{PROTO.name}"
        out = work / "out"
        out.mkdir()
        status = protoc.main(["grpc_tools.protoc", f"-I{work / 'src'}", f"-I{include}",
                              f"--python_out={out}", f"--grpc_python_out={out}", relative])
        if status != 0:
            raise RuntimeError(f"grpc_tools.protoc failed on {PROTO} (exit status {status})")
        try:
            os.rename(out / PACKAGE.replace(".", "/"), dest)
        except OSError:
            if not (dest / "tei_pb2_grpc.py").exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _folder() -> pathlib.Path:
    """Where the generated pair is: the cache, or a temporary folder when it is read-only."""
    key = _key()
    for root in (_cache_root(), pathlib.Path(tempfile.gettempdir()) / "vllm-grpc"):
        dest = root / key
        if (dest / "tei_pb2_grpc.py").exists():
            return dest
        try:
            _generate(dest)
            return dest
        except OSError:
            continue
    dest = pathlib.Path(tempfile.mkdtemp(prefix="vllm-grpc-")) / key
    _generate(dest)
    return dest


def _load(name: str, path: pathlib.Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"{PACKAGE}.{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the _grpc module imports the _pb2 one by this name
    spec.loader.exec_module(module)
    return module


def tei_stubs() -> tuple[types.ModuleType, types.ModuleType]:
    """(tei_pb2, tei_pb2_grpc): the messages and the servicer/stub classes of tei.v1."""
    global _loaded
    if _loaded is None:
        require_grpc()
        folder = _folder()
        _loaded = (_load("tei_pb2", folder / "tei_pb2.py"),
                   _load("tei_pb2_grpc", folder / "tei_pb2_grpc.py"))
    return _loaded
