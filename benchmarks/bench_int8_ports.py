"""Why the AVX2 int8 kernel uses int16 `vpmaddwd`: the inner steps' throughput on this core.

csrc/int8_gemm_avx2.cpp needs exact s8 x s8 products on CPUs without int8 dot products.
Two ways on AVX2, timed here as loops of independent ymm operations (8 chains, inline
assembly, one core, no memory), next to the float32 FMA the float32 path runs on:

* `u8 x s8` (the kernel before session 22): `vpsignb` (the sign of a onto w) + `vpmaddubsw`
  (|a| x sign(a) w, pairs in int16) + `vpmaddwd` by ones + `vpaddd`: 32 products a step;
* `int16` (now): `vpmaddwd` on int16 a and w + `vpaddd`: 16 products a step, and with the
  kernel's weight widening (`vpmovsxbw`, 2 per 6 rows of a 6-row tile) as it runs.

Products per ns is the figure: where `vpsignb` shares the multiply pipes (Zen 4, Intel
since Haswell) the first way is capped at 3 multiply-pipe operations per 32 products.
Needs gcc (x86-64). Writes results/bench_int8_ports.json.

    python benchmarks/bench_int8_ports.py [--iterations 100000000]
"""
from __future__ import annotations

import argparse
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import write_json  # noqa: E402

# One loop per step; each body is 8 independent chains (ymm0-7 temporaries, 8-11 sums,
# 12 |a|, 13 a, 14 w, 15 ones), so only throughput limits it.
STEPS = {
    "u8 x s8 (vpsignb, vpmaddubsw, vpmaddwd, vpaddd)": (32, "vpsignb %%ymm13,%%ymm14,%%ymm{t}\\n"
        "vpmaddubsw %%ymm{t},%%ymm12,%%ymm{t}\\nvpmaddwd %%ymm15,%%ymm{t},%%ymm{t}\\n"
        "vpaddd %%ymm{t},%%ymm{s},%%ymm{s}\\n"),
    "int16 (vpmaddwd, vpaddd)": (16, "vpmaddwd %%ymm14,%%ymm13,%%ymm{t}\\n"
        "vpaddd %%ymm{t},%%ymm{s},%%ymm{s}\\n"),
    "float32 FMA (vfmadd231ps)": (8, "vfmadd231ps %%ymm14,%%ymm13,%%ymm{t}\\n"),
}
WIDEN = "vpmovsxbw %%xmm14,%%ymm{t}\\n"  # the kernel's: 2 per 6 rows x 2 vectors


def source(iterations: int) -> str:
    """A C program timing each step's loop, printing `name<TAB>steps per ns`."""
    loops = []
    for i, (name, (_, step)) in enumerate(STEPS.items()):
        body = "".join(step.format(t=t, s=8 + t % 4) for t in range(8))
        loops.append((name, body))
    mix = "".join(STEPS["int16 (vpmaddwd, vpaddd)"][1].format(t=t, s=8 + t % 4)
                  for t in range(6)) + WIDEN.format(t=6) + WIDEN.format(t=7)
    loops.append(("int16 + the kernel's widening (6 steps, 2 vpmovsxbw)", mix))
    clobber = ", ".join(f'"xmm{r}"' for r in range(12))
    out = ["#include <stdio.h>", "#include <time.h>",
           "static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);"
           " return t.tv_sec + t.tv_nsec * 1e-9; }", "int main(void) {", "  double t;"]
    for name, body in loops:
        steps = 6 if name.startswith("int16 + ") else 8
        out += [f"  t = now(); for (long i = 0; i < {iterations}L; ++i)",
                f'    __asm__ volatile("{body}" ::: {clobber});',
                f'  printf("{name}\\t%f\\n", {steps}.0 * {iterations} / (now() - t) / 1e9);']
    out += ["  return 0;", "}"]
    return "\n".join(out)


def measure(iterations: int) -> dict[str, float]:
    """Steps per ns of each loop (compiled with gcc -O2 in a temporary directory)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = pathlib.Path(tmp) / "ports.c", pathlib.Path(tmp) / "ports"
        src.write_text(source(iterations))
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
        lines = subprocess.run([str(exe)], check=True, capture_output=True,
                               text=True).stdout.splitlines()
    return {name: float(rate) for name, rate in (line.split("\t") for line in lines)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=100_000_000)
    args = ap.parse_args()
    if platform.machine() not in ("x86_64", "AMD64") or shutil.which("gcc") is None:
        print("skipped: needs an x86-64 CPU and gcc")
        return
    rates = measure(args.iterations)
    fma = rates["float32 FMA (vfmadd231ps)"] * 8
    rows = {}
    print(f"{'step':56s} {'steps/ns':>9s} {'products/ns':>12s} {'/ FMA':>6s}")
    for name, rate in rates.items():
        per_step = 16 if name.startswith("int16 + ") else STEPS[name][0]
        products = rate * per_step
        rows[name] = {"steps_per_ns": rate, "products_per_ns": products,
                      "over_fma": products / fma}
        print(f"{name:56s} {rate:9.2f} {products:12.1f} {products / fma:6.2f}")
    write_json("bench_int8_ports", {"iterations": args.iterations, "steps": rows})


if __name__ == "__main__":
    main()
