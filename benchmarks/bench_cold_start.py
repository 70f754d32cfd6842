"""Cold start: `python examples/embed.py` (the bundled MiniLM) from launch to its first embedding.

Each run is a fresh interpreter (subprocess, unbuffered output) with a new, empty
XDG_CACHE_HOME, so nothing a previous run built or cached on disk helps (the OS page cache
does: the first run is reported apart). Times the first line of output that prints an
embedding, and the whole run with its CPU seconds (user + system, all threads: on a
shared machine the wall time grows with the load, the CPU time much less).

Then one more run, under `python -X importtime`, through cold_phases.py: the same example
with the engine's start-up steps timed (wall and CPU seconds each: imports, config, tokenizer,
kernel library, weights, oneDNN packing, first forward, ...) and the imports' own time summed
by top-level package. `--importtime` also lists the slowest top-level imports (cumulative).

Bytecode: a fresh venv compiles the project's modules on the first run and writes their
.pyc (site-packages got theirs at install), so later runs read them. This environment
sets PYTHONDONTWRITEBYTECODE=1, which makes every run compile the project from source;
`--pyc` lets the children write and read .pyc as a user's venv does (the first run then
writes them).

    python benchmarks/bench_cold_start.py [--repeats 3] [--importtime] [--pyc]

Writes results/bench_cold_start.json. Target: first embedding <= 8 s.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import median, write_json  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "embed.py"
PHASES = pathlib.Path(__file__).parent / "cold_phases.py"
TARGET_S = 8.0


def child_env(cache: str, pyc: bool) -> dict[str, str]:
    env = {**os.environ, "XDG_CACHE_HOME": cache, "PYTHONUNBUFFERED": "1"}
    if pyc:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def one_run(pyc: bool = False) -> dict:
    """Seconds to the first embedding line and to exit, and the run's CPU seconds."""
    with tempfile.TemporaryDirectory(prefix="vllm-cold-") as cache, \
            tempfile.TemporaryFile("w+") as stderr:  # a pipe could fill and stall the child
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(EXAMPLE)],
                                env=child_env(cache, pyc), text=True,
                                stdout=subprocess.PIPE, stderr=stderr)
        first = None
        for line in proc.stdout:
            if first is None and "-dim embedding" in line:
                first = time.perf_counter() - start
        _, status, usage = os.wait4(proc.pid, 0)
        stderr.seek(0)
        err = stderr.read()
        total = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode or first is None:
            raise RuntimeError(f"examples/embed.py failed:\n{err[-2000:]}")
    return {"first_embedding_s": first, "total_s": total,
            "cpu_s": usage.ru_utime + usage.ru_stime}


def phase_run(pyc: bool) -> dict:
    """cold_phases.py's breakdown of one cold start, plus the imports' own (self) seconds
    summed by top-level package, from -X importtime."""
    with tempfile.TemporaryDirectory(prefix="vllm-cold-") as cache:
        out = pathlib.Path(cache) / "phases.json"
        run = subprocess.run([sys.executable, "-X", "importtime", str(PHASES),
                              repr(time.time()), str(out)], env=child_env(cache, pyc),
                             text=True, capture_output=True)
        if run.returncode:
            raise RuntimeError(f"cold_phases.py failed:\n{run.stderr[-2000:]}")
        result = json.loads(out.read_text())
    result["imports_by_package_s"] = imports_by_package(run.stderr)
    result["slowest_imports_s"] = slowest_imports(run.stderr)
    return result


def imports_by_package(stderr: str, top: int = 10) -> list[tuple[str, float]]:
    """(top-level package, seconds its modules took to import, nested imports excluded):
    these add up to the whole import time."""
    totals: dict[str, float] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        own, _, name = line[len("import time:"):].split("|")
        package = name.strip().split(".")[0]
        totals[package] = totals.get(package, 0.0) + int(own) / 1e6
    rows = sorted(totals.items(), key=lambda r: -r[1])
    rest = sum(secs for _, secs in rows[top:])
    return rows[:top] + ([("(the rest)", rest)] if rest else [])


def print_phases(result: dict) -> None:
    print(f"one cold start by phase (under -X importtime): first embedding at "
          f"{result['first_embedding_s']:.2f} s, {result['first_embedding_cpu_s']:.2f} CPU s")
    print(f"  {'wall s':>7} {'CPU s':>7}  phase")
    for row in result["phases"]:
        calls = f" (x{row['calls']})" if row.get("calls", 1) > 1 else ""
        print(f"  {row['wall_s']:7.3f} {row['cpu_s']:7.3f}  {row['phase']}{calls}")
    print("  imports' own wall seconds by package (inside the phases above):")
    for name, secs in result["imports_by_package_s"]:
        print(f"  {secs:7.3f}          {name}")


def slowest_imports(stderr: str, top: int = 15) -> list[tuple[str, float]]:
    """(module, cumulative seconds) of the top-level imports, slowest first."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line[len("import time:"):].split("|")
        if len(name) - len(name.lstrip()) <= 3:  # " " + 2 per nesting level: top level
            rows.append((name.strip(), int(cumulative) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--importtime", action="store_true", help="also list the slowest top-level imports")
    ap.add_argument("--quick", action="store_true", help="one run")
    ap.add_argument("--pyc", action="store_true",
                    help="let the children write and read .pyc (unset PYTHONDONTWRITEBYTECODE)")
    args = ap.parse_args()
    runs = [one_run(pyc=args.pyc) for _ in range(1 if args.quick else args.repeats)]
    firsts = [r["first_embedding_s"] for r in runs]
    payload = {"target_s": TARGET_S, "first_embedding_s": firsts,
               "first_run_s": firsts[0], "median_s": median(firsts),
               "total_s": [r["total_s"] for r in runs], "cpu_s": [r["cpu_s"] for r in runs],
               "load_average": os.getloadavg(), "pyc": args.pyc or
               not os.environ.get("PYTHONDONTWRITEBYTECODE")}
    print(f"examples/embed.py, launch to first embedding: first run {firsts[0]:.2f} s, "
          f"median of {len(firsts)} {payload['median_s']:.2f} s (target <= {TARGET_S:.0f} s); "
          f"whole run {median(payload['cpu_s']):.1f} CPU s; load average "
          f"{os.getloadavg()[0]:.1f}")
    payload["breakdown"] = breakdown = phase_run(args.pyc)
    print_phases(breakdown)
    if args.importtime:
        payload["slowest_imports_s"] = breakdown["slowest_imports_s"]
        print("slowest top-level imports (cumulative s):")
        for name, secs in payload["slowest_imports_s"]:
            print(f"  {secs:6.2f}  {name}")
    write_json("bench_cold_start", payload)


if __name__ == "__main__":
    main()
