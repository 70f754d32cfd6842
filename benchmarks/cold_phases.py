"""Run examples/embed.py in this (fresh) interpreter and time its cold start by phase.

Started by bench_cold_start.py as `python [-X importtime] cold_phases.py LAUNCH OUT.json`
(LAUNCH: the parent's time.time() just before it started this process). Each phase gets
its wall and CPU seconds (CPU = user + system of all the process's threads, so it hardly
moves with the machine's load, unlike the wall time). A phase's figures are its own time:
time spent in a phase nested inside it (e.g. the weights inside the model build) is
counted once, in the inner one. Lazy imports run inside the phase that triggers them.

The hooks wrap engine functions by name; the example itself runs unchanged, and the
clock stops at its first embedding line.
"""
from __future__ import annotations

import json
import pathlib
import runpy
import sys
import time

LAUNCH = float(sys.argv[1])
START_WALL, START_CPU = time.time(), time.process_time()  # CPU since the process began
EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "embed.py"


class Phases:
    """Wall and CPU seconds per named phase, nested phases subtracted from their parent."""

    def __init__(self) -> None:
        self.rows: dict[str, list[float]] = {}  # name -> [wall, cpu, calls]
        self.stack: list[list] = []             # [name, wall0, cpu0, child_wall, child_cpu]

    def enter(self, name: str) -> None:
        self.rows.setdefault(name, [0.0, 0.0, 0])  # rows in the order phases first start
        self.stack.append([name, time.perf_counter(), time.process_time(), 0.0, 0.0])

    def exit(self) -> None:
        name, wall0, cpu0, child_wall, child_cpu = self.stack.pop()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        row = self.rows.setdefault(name, [0.0, 0.0, 0])
        row[0] += wall - child_wall
        row[1] += cpu - child_cpu
        row[2] += 1
        if self.stack:
            self.stack[-1][3] += wall
            self.stack[-1][4] += cpu

    def snapshot(self) -> dict[str, list[float]]:
        """The rows as if every open phase ended now."""
        rows = {name: list(row) for name, row in self.rows.items()}
        now_wall, now_cpu = time.perf_counter(), time.process_time()
        inner_wall = inner_cpu = 0.0
        for name, wall0, cpu0, child_wall, child_cpu in reversed(self.stack):
            wall, cpu = now_wall - wall0, now_cpu - cpu0
            row = rows.setdefault(name, [0.0, 0.0, 0])
            row[0] += wall - child_wall - inner_wall
            row[1] += cpu - child_cpu - inner_cpu
            row[2] += 1
            inner_wall, inner_cpu = wall, cpu
        return rows

    def wrap(self, owner, attr: str, name: str) -> None:
        """Time every call of `owner.attr` as phase `name`."""
        inner = getattr(owner, attr)

        def timed(*args, **kwargs):
            self.enter(name)
            try:
                return inner(*args, **kwargs)
            finally:
                self.exit()
        setattr(owner, attr, timed)


class FirstEmbedding:
    """stdout that notes when the example prints its first embedding line, and the
    phases up to then."""

    def __init__(self, out, phases: Phases) -> None:
        self.out, self.phases, self.at, self.rows = out, phases, None, {}

    def write(self, text: str) -> int:
        if self.at is None and "-dim embedding" in text:
            self.at = (time.time(), time.process_time())
            self.rows = self.phases.snapshot()
        return self.out.write(text)

    def __getattr__(self, name):
        return getattr(self.out, name)


def install_hooks(p: Phases) -> None:
    """The engine's start-up steps, by the functions that do them."""
    from vllm.config import model as config_model
    from vllm.engine import arg_utils, llm_engine
    from vllm.entrypoints.llm import LLM
    from vllm.worker import model_loader
    from vllm._kernels import cpu_kernels, linear
    from vllm.platforms.cpu import CpuPlatform
    from vllm.worker import model_runner
    p.wrap(LLM, "__init__", "LLM(): the rest (KV cache, scheduler, engine)")
    p.wrap(LLM, "embed", "embed(): tokenize, schedule, pool, outputs")
    p.wrap(arg_utils.EngineArgs, "create_engine_config", "config: the rest (registry, gate)")
    p.wrap(config_model, "load_hf_config", "config: HF config.json (AutoConfig)")
    p.wrap(config_model, "load_st_config", "config: sentence-transformers files")
    p.wrap(llm_engine, "load_tokenizer", "tokenizer load")
    p.wrap(CpuPlatform, "_prepare", "platform prepare: malloc, logs")
    p.wrap(cpu_kernels, "library", "C++ kernel library load")
    p.wrap(linear, "onednn_linear_ok", "oneDNN self-check")
    p.wrap(model_runner, "build_model", "model build: modules, cast")
    p.wrap(model_loader, "_load", "weights: safetensors read + copy")
    p.wrap(model_loader, "bind_ops", "bind ops: oneDNN weight packing")
    p.wrap(model_runner.ModelRunner, "execute", "model steps: forward + pooler")


def main() -> None:
    p = Phases()
    p.enter("imports: the example's module level")
    module = runpy.run_path(str(EXAMPLE), run_name="cold_phases_example")
    p.exit()
    install_hooks(p)
    sys.stdout = watch = FirstEmbedding(sys.stdout, p)
    p.enter("the example's own work")
    module["main"]()
    p.exit()
    sys.stdout = watch.out
    wall_at, cpu_at = watch.at
    phases = [{"phase": "interpreter start", "wall_s": START_WALL - LAUNCH, "cpu_s": START_CPU}]
    for name, (wall, cpu, calls) in watch.rows.items():  # up to the first embedding line
        phases.append({"phase": name, "wall_s": wall, "cpu_s": cpu, "calls": calls})
    payload = {"first_embedding_s": wall_at - LAUNCH, "first_embedding_cpu_s": cpu_at,
               "phases": phases}
    pathlib.Path(sys.argv[2]).write_text(json.dumps(payload))


if __name__ == "__main__":
    main()
