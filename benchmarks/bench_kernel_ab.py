"""Builds of the C++ kernel library against each other on bench_attention's shapes.

An A/B of a kernel change: build the old and the new tree into two folders (`cmake -S . -B
DIR -DCMAKE_BUILD_TYPE=Release`, `-DVLLM_CPU_ARCH=x86-64-v3` for the AVX2 variant) and
name both libraries. Each round runs one child process per library in turn
(`VLLM_CPU_KERNELS_LIB`); a child times `--calls` calls of each shape and reports its best;
a library's figure per shape is the median over the rounds of those bests. One process
against another moved up to 1.5x on a VM (huge-page luck for the 35-270 MB q/k/v), a
kernel's calls within one process a few percent: so no library runs twice in a row and
no figure rests on one process.

`--kernel bf16`: the AVX512-BF16 kernel on bfloat16 q/k/v with bfloat16 weights (P), as an
int8 BERT runs it; `f32` (default): the float32 kernel.

    python benchmarks/bench_kernel_ab.py OLD/libvllm_cpu_kernels.so NEW/libvllm_cpu_kernels.so
        [--rounds 5] [--calls 8] [--kernel f32|bf16] [--shapes minilm,head_dim_128]

Writes results/bench_kernel_ab.json.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_attention import NONE, SHAPES, packed  # noqa: E402
from common import median, write_json  # noqa: E402


def child(kernel_kind: str, shapes: list[str], calls: int) -> dict[str, float]:
    """In a child: each shape's best call, in ms, on the library VLLM_CPU_KERNELS_LIB names."""
    from vllm._kernels import cpu_kernels
    from vllm.platforms.cpu_malloc import tune_malloc
    tune_malloc()  # as the engine runs: freed buffers stay in the heap
    bf16 = kernel_kind == "bf16"
    kernel = (cpu_kernels.varlen_attention_bf16_kernel() if bf16
              else cpu_kernels.varlen_attention_kernel())
    if kernel is None:
        raise SystemExit(f"no {kernel_kind} kernel: "
                         f"{cpu_kernels.kernel_status('varlen_attention')}")
    best = {}
    for name in shapes:
        hq, hkv, d, causal, lo, hi = SHAPES[name]
        lengths = [int(n) for n in np.random.default_rng(0).integers(lo, hi + 1, 64)]
        dtype = torch.bfloat16 if bf16 else torch.float32
        q, k, v = packed(hq, hkv, d, lengths, torch.Generator().manual_seed(0), dtype)
        off = torch.tensor(np.cumsum([0] + lengths))
        extra = {"out_dtype": torch.float32, "bf16_pv": True} if bf16 else {}
        run = lambda: kernel(q, k, v, off, off, NONE, NONE, d ** -0.5, causal, **extra)  # noqa
        run()
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        best[name] = 1e3 * min(times)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("libraries", nargs="*", help="two or more kernel libraries")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--kernel", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--shapes", default="minilm,classifier_40m,head_dim_128")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    if args.child:
        print(json.dumps(child(args.kernel, shapes, args.calls)))
        return
    if len(args.libraries) < 2:
        ap.error("name two or more libraries")
    bests: dict[str, dict[str, list[float]]] = {lib: {s: [] for s in shapes}
                                                for lib in args.libraries}
    for _ in range(args.rounds):
        for lib in args.libraries:
            env = {**os.environ, "VLLM_CPU_KERNELS_LIB": lib}
            out = subprocess.run([sys.executable, __file__, "--child", "--kernel", args.kernel,
                                  "--shapes", args.shapes, "--calls", str(args.calls)],
                                 env=env, capture_output=True, text=True, check=True)
            for shape, ms in json.loads(out.stdout.strip().splitlines()[-1]).items():
                bests[lib][shape].append(ms)
    base = args.libraries[0]
    print(f"{args.kernel} kernel, {args.rounds} rounds, best of {args.calls} calls a process")
    print(f"{'shape':<16}" + "".join(f"{pathlib.Path(lib).parent.name[:18]:>20}"
                                     for lib in args.libraries) + "   speed-up (vs first)")
    results = {}
    for shape in shapes:
        ms = [median(bests[lib][shape]) for lib in args.libraries]
        ups = [ms[0] / m for m in ms[1:]]
        print(f"{shape:<16}" + "".join(f"{m:>17.2f} ms" for m in ms) + "   "
              + " ".join(f"{u:.3f}x" for u in ups))
        results[shape] = {lib: {"median_ms": median(bests[lib][shape]),
                                "bests_ms": bests[lib][shape]} for lib in args.libraries}
    write_json("bench_kernel_ab", {"kernel": args.kernel, "rounds": args.rounds,
                                   "calls": args.calls, "baseline": base, "shapes": results})


if __name__ == "__main__":
    main()
