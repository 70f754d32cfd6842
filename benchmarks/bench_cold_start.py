"""Cold start: `python examples/embed.py` (the bundled MiniLM) from launch to its first embedding.

Each run is a fresh interpreter (subprocess, unbuffered output) with a new, empty
XDG_CACHE_HOME, so nothing a previous run built or cached on disk helps (the OS page cache
does: the first run is reported apart). Times the first line of output that prints an
embedding, and the whole run with its CPU seconds (user + system, all threads: on a
shared machine the wall time grows with the load, the CPU time much less). `--importtime` also runs it once under `python -X importtime`
and lists the slowest imports (cumulative), to say where the start-up goes.

    python benchmarks/bench_cold_start.py [--repeats 3] [--importtime]

Writes results/bench_cold_start.json. Target: first embedding <= 8 s.
"""
from __future__ import annotations

import argparse
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
TARGET_S = 8.0


def one_run(extra: tuple[str, ...] = ()) -> dict:
    """Seconds to the first embedding line and to exit; stderr kept for -X importtime."""
    with tempfile.TemporaryDirectory(prefix="vllm-cold-") as cache, \
            tempfile.TemporaryFile("w+") as stderr:  # a pipe could fill and stall the child
        env = {**os.environ, "XDG_CACHE_HOME": cache, "PYTHONUNBUFFERED": "1"}
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *extra, str(EXAMPLE)], env=env, text=True,
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
    return {"first_embedding_s": first, "total_s": total, "stderr": err,
            "cpu_s": usage.ru_utime + usage.ru_stime}


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
    ap.add_argument("--importtime", action="store_true", help="also profile the imports")
    ap.add_argument("--quick", action="store_true", help="one run")
    args = ap.parse_args()
    runs = [one_run() for _ in range(1 if args.quick else args.repeats)]
    firsts = [r["first_embedding_s"] for r in runs]
    payload = {"target_s": TARGET_S, "first_embedding_s": firsts,
               "first_run_s": firsts[0], "median_s": median(firsts),
               "total_s": [r["total_s"] for r in runs], "cpu_s": [r["cpu_s"] for r in runs],
               "load_average": os.getloadavg()}
    print(f"examples/embed.py, launch to first embedding: first run {firsts[0]:.2f} s, "
          f"median of {len(firsts)} {payload['median_s']:.2f} s (target <= {TARGET_S:.0f} s); "
          f"whole run {median(payload['cpu_s']):.1f} CPU s; load average "
          f"{os.getloadavg()[0]:.1f}")
    if args.importtime:
        profile = one_run(("-X", "importtime"))
        payload["slowest_imports_s"] = slowest_imports(profile["stderr"])
        print("slowest top-level imports (cumulative s):")
        for name, secs in payload["slowest_imports_s"]:
            print(f"  {secs:6.2f}  {name}")
    write_json("bench_cold_start", payload)


if __name__ == "__main__":
    main()
