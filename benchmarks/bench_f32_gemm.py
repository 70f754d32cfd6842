"""The C++ float32 GEMM (csrc/f32_gemm.cpp) against oneDNN's, each with its epilogue fused.

The projections of MiniLM (384 hidden: qkv, out + residual, up + GELU, down + residual) and
of Qwen3-0.6B (1024 hidden: qkv, o + residual, gate + SiLU, down + residual) at `--rows`
rows, with bias, each on weights packed once for it (`layers.f32_gemm.CppGemm.pack`,
oneDNN's `_reorder_linear_weight`). Interleaved, best of `--repeats` rounds of `--calls`
calls; GFLOP/s, share of the float32 peak (`bench_peak.measured_peak`), ratio, and the
largest difference from float64 torch of each. The engine takes the C++ GEMM by default
with an AVX2 build of the kernels; to see what an AVX2-only CPU sees on an AVX-512 one,
cap oneDNN and load the AVX2 build:

    ONEDNN_MAX_CPU_ISA=AVX2 VLLM_CPU_KERNELS_LIB=<cmake -DVLLM_CPU_ARCH=x86-64-v3 build> \\
        python benchmarks/bench_f32_gemm.py [--rows 2048] [--repeats 7] [--calls 5]

Writes results/bench_f32_gemm.json.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process)
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_peak import measured_peak  # noqa: E402
from common import write_json  # noqa: E402

# model -> [(in, out, epilogue)], epilogue None, "add" (a residual) or an activation
SHAPES = {
    "minilm": [(384, 1152, None), (384, 384, "add"), (384, 1536, "gelu"), (1536, 384, "add")],
    "qwen3_0.6b": [(1024, 4096, None), (2048, 1024, "add"), (1024, 3072, "silu"),
                   (3072, 1024, "add")],
}


def projection(gemm, rows: int, k: int, n: int, epilogue, seed: int):
    """(call, float64 reference) of one projection on `gemm` ("cpp" or "onednn")."""
    from vllm.model_executor.layers import linear as lin
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g) / k ** 0.5
    b, other = torch.randn(n, generator=g), torch.randn(rows, n, generator=g)
    packed = gemm.pack(w)
    if epilogue == "add":
        call = lambda: gemm.linear_add(x, other, packed, b)  # noqa: E731
    else:
        call = lambda: gemm.linear(x, packed, b, epilogue)  # noqa: E731
    ref = F.linear(x.double(), w.double(), b.double())
    ref = ref + other.double() if epilogue == "add" else \
        lin.apply_activation(epilogue, ref) if epilogue else ref
    return call, ref


def best_times(calls: dict, repeats: int, per_round: int) -> dict[str, float]:
    """Each callable's best seconds per call over `repeats` interleaved rounds."""
    best = {name: float("inf") for name in calls}
    for fn in calls.values():
        fn()  # warm-up: pages, oneDNN's primitive
    for _ in range(repeats):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            for _ in range(per_round):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / per_round)
    return best


def measure(models: list[str], rows: int, repeats: int, per_round: int) -> dict:
    from vllm._kernels.cpu_kernels import f32_gemm_kernel, kernel_isa
    from vllm.model_executor.layers.f32_gemm import CppGemm
    from vllm.model_executor.layers.linear import ONEDNN
    kernel = f32_gemm_kernel()
    if kernel is None:
        raise SystemExit("the kernel library has no C++ float32 GEMM here")
    gemms = {"cpp": CppGemm(kernel), "onednn": ONEDNN}
    out = {"kernel_isa": kernel_isa(), "rows": rows, "models": {}}
    for model in models:
        shapes, totals = [], {name: 0.0 for name in gemms}
        flops = 0.0
        for i, (k, n, epilogue) in enumerate(SHAPES[model]):
            made = {name: projection(g, rows, k, n, epilogue, i) for name, g in gemms.items()}
            best = best_times({name: c for name, (c, _) in made.items()}, repeats, per_round)
            err = {name: (c().double() - ref).abs().max().item()
                   for name, (c, ref) in made.items()}
            f = 2.0 * rows * k * n
            flops += f
            for name in gemms:
                totals[name] += best[name]
            shapes.append({"k": k, "n": n, "epilogue": epilogue or "none",
                           **{f"{name}_gflops": f / best[name] / 1e9 for name in gemms},
                           **{f"{name}_max_err": err[name] for name in gemms}})
        out["models"][model] = {"shapes": shapes, **{f"{name}_gflops": flops / t / 1e9
                                                     for name, t in totals.items()}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--models", default="minilm,qwen3_0.6b")
    ap.add_argument("--quick", action="store_true", help="512 rows, 3 repeats, 2 calls")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.repeats, args.calls = 512, 3, 2
    from vllm.platforms.cpu_malloc import tune_malloc
    tune_malloc()  # as the engine runs (large buffers kept in the heap)
    result = measure(args.models.split(","), args.rows, args.repeats, args.calls)
    peak = measured_peak("float32")
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "unset")
    print(f"kernels: {result['kernel_isa']} build; ONEDNN_MAX_CPU_ISA={cap}; "
          f"{torch.get_num_threads()} threads; float32 peak {peak:.1f} GFLOP/s; "
          f"{result['rows']} rows")
    print(f"{'model':11} {'k x n':>11} {'epilogue':8} {'cpp':>8} {'onednn':>8} {'ratio':>6} "
          f"{'cpp %pk':>7} {'err cpp':>8} {'err onednn':>10}")
    for model, r in result["models"].items():
        for s in r["shapes"] + [{"k": "all", "n": "", "epilogue": "", **r}]:
            c, o = s["cpp_gflops"], s["onednn_gflops"]
            errs = f"{s['cpp_max_err']:8.1e} {s['onednn_max_err']:10.1e}" if "cpp_max_err" \
                in s else ""
            print(f"{model:11} {str(s['k']) + ' x ' + str(s['n']):>11} {s['epilogue']:8} "
                  f"{c:8.1f} {o:8.1f} {c / o:5.2f}x {100 * c / peak:6.1f}% {errs}")
    write_json("bench_f32_gemm", {**result, "peak_gflops": peak, "onednn_max_cpu_isa": cap,
                                  "threads": torch.get_num_threads()})


if __name__ == "__main__":
    main()
