"""The package's imports point down one list of layers, with no cycle (docs/architecture.md).

Every import of a `vllm` module counts: at the top of a module, inside a function (kept
there for start-up time), and under `if TYPE_CHECKING:`. Only a module's
`if __name__ == "__main__":` block is left out: it is a program's entry, above every layer,
and nothing imports it. The test reads the source (ast), so it needs no import of the code.
"""
from __future__ import annotations

import ast
import collections
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "vllm"

# Bottom to top. A package may import only packages of a lower layer (never one of its own
# layer, never one above). Packages are `vllm.X` (a folder or a top-level module).
LAYERS: list[set[str]] = [
    {"vllm.envs", "vllm.version", "vllm.outputs", "vllm.tasks"},
    {"vllm.logger", "vllm.tracing"},
    {"vllm._kernels", "vllm.transformers_utils", "vllm.multimodal"},
    {"vllm.attention"},
    {"vllm.pooling_params"},
    {"vllm.model_executor"},
    {"vllm.platforms"},
    {"vllm.config"},
    {"vllm.core", "vllm.lora"},
    {"vllm.worker"},
    {"vllm.engine"},
    {"vllm.scaleout"},
    {"vllm.entrypoints"},
    {"vllm", "vllm.__main__"},
]
# Inside `vllm.entrypoints`, the same rule for its parts (the shared helper modules,
# `chat_inputs`, `quantize`, `sparse`, ..., are the bottom layer).
ENTRYPOINT_LAYERS: list[set[str]] = [
    {"vllm.entrypoints.embed_options"},
    {"vllm.entrypoints.openai", "vllm.entrypoints.llm"},
    # grpc: TEI's gRPC service answers through openai's TEI serving code (tei_front), so
    # it sits above openai; cli starts it beside the HTTP server (run_server's companions).
    {"vllm.entrypoints.batch", "vllm.entrypoints.grpc"},
    {"vllm.entrypoints.cli"},
]


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module an imported name lives in (`vllm.a.b.func` -> `vllm.a.b`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str, path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    tree.body = [n for n in tree.body if not (isinstance(n, ast.If) and
                                              "__main__" in ast.unparse(n.test))]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names += [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    found = {_resolve(n) for n in names if n.split(".")[0] == "vllm"}
    return {m for m in found if m and m != module}


EDGES = {m: _imported(m, p) for m, p in MODULES.items()}


def _cycles(nodes, edges) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    group.append(top)
                    if top == node:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _rank(layers: list[set[str]], name: str) -> int:
    for i, layer in enumerate(layers):
        if name in layer:
            return i
    raise AssertionError(f"{name} is in no layer: add it to LAYERS (tests/test_layering.py) "
                         "and to docs/architecture.md")


def test_no_module_imports_itself_back():
    assert _cycles(sorted(MODULES), EDGES) == []


def test_every_package_import_points_down():
    upward = [f"{a} -> {b} ({_package(a)} is layer {_rank(LAYERS, _package(a))}, "
              f"{_package(b)} layer {_rank(LAYERS, _package(b))})"
              for a, targets in EDGES.items() for b in sorted(targets)
              if _package(a) != _package(b) and
              _rank(LAYERS, _package(a)) <= _rank(LAYERS, _package(b))]
    assert upward == []


def _entry_part(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:3])


def test_entrypoints_parts_point_down():
    """cli > batch, grpc > openai, llm > embed_options > the shared helpers (any other
    entrypoints module)."""
    def rank(name: str) -> int:
        return next((i + 1 for i, layer in enumerate(ENTRYPOINT_LAYERS) if name in layer), 0)
    upward = [f"{a} -> {b}" for a, targets in EDGES.items() for b in sorted(targets)
              if a.startswith("vllm.entrypoints.") and b.startswith("vllm.entrypoints.")
              and _entry_part(a) != _entry_part(b)
              and rank(_entry_part(a)) <= rank(_entry_part(b))]
    assert upward == []


def test_the_reader_sees_function_level_and_relative_imports():
    """The graph is not empty by accident: known imports of each kind are in it."""
    assert "vllm._kernels.cpu_kernels" in EDGES["vllm.attention.backends.cpu_native"]
    inside_functions = EDGES["vllm.entrypoints.cli.main"]  # its commands import lazily
    assert "vllm.entrypoints.openai.api_server" in inside_functions
    package_edges = collections.Counter(_package(b) for t in EDGES.values() for b in t)
    assert package_edges["vllm.config"] > 5
