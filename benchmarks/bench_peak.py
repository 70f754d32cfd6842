"""The machine's own dense matmul rate (GFLOP/s), float32 and bfloat16, measured with torch.

Two GEMM libraries inside torch are timed: `torch.matmul` (MKL's sgemm for float32 on x86;
on AMD CPUs MKL runs its AVX2 code) and oneDNN (`torch.ops.mkldnn._linear_pointwise`, the
engine's projections, AVX-512). The peak is the best of both, so MFU is against the best
dense rate torch can reach here, not against the slower library. Shapes: a square 2048^3 matmul and the shapes of the models benchmarked here (MiniLM's
FFN, [4096 tokens x 384] @ [384 x 1536] and back; the causal classifier's gate/up
projection, [4096 x 512] @ [512 x 1408]). Each shape runs in timed chunks of several calls;
a shape's rate is its best chunk, and the peak for a dtype is the best shape. The other
benchmarks divide their achieved model FLOP/s by this peak (model FLOP utilisation, MFU).

    python benchmarks/bench_peak.py [--quick]

`measured_peak(dtype)` returns the peak in GFLOP/s, from results/peak.json when that file
was measured on this machine with this torch and thread count, else measuring it (and
writing the file). A rerun on the same machine keeps the best peak seen so far (a
measurement taken while other work shares the CPU only ever reads low), and records this
run's own figure beside it. Writes results/peak.json.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process, as a user's script gets)
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import RESULTS, has_fast_bf16, machine_info, write_json  # noqa: E402

SHAPES = [(2048, 2048, 2048), (4096, 384, 1536), (4096, 1536, 384), (4096, 512, 1408)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _gemm(backend: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor):
    """A call computing [m x k] @ [k x n] through `backend` ('matmul' or 'onednn')."""
    if backend == "matmul":
        return lambda: torch.matmul(a, b, out=out)
    op, b_t = torch.ops.mkldnn._linear_pointwise, b.t().contiguous()
    return lambda: op(a, b_t, None, "none", [], "")


def backends() -> list[str]:
    have = torch.backends.mkldnn.is_available() and \
        hasattr(torch.ops.mkldnn, "_linear_pointwise")
    return ["matmul", "onednn"] if have else ["matmul"]


def matmul_gflops(dtype: torch.dtype, shape: tuple[int, int, int], chunks: int = 5,
                  min_chunk_s: float = 0.2, backend: str = "matmul") -> dict:
    """Rate of [m x k] @ [k x n] in `dtype`: best and median over `chunks` timed chunks."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(k, n, generator=gen).to(dtype)
    call = _gemm(backend, a, b, torch.empty(m, n, dtype=dtype))
    call()  # warm-up; also sizes the chunks
    start = time.perf_counter()
    call()
    calls = max(1, int(min_chunk_s / max(time.perf_counter() - start, 1e-6)))
    rates = []
    for _ in range(chunks):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        rates.append(2 * m * k * n * calls / (time.perf_counter() - start) / 1e9)
    rates.sort()
    return {"backend": backend, "shape": list(shape), "best_gflops": rates[-1],
            "median_gflops": rates[len(rates) // 2], "calls_per_chunk": calls}


def default_dtypes() -> list[str]:
    """float32, and bfloat16 where the CPU computes it natively: emulated bfloat16 GEMMs
    (AVX2-only CPUs) run ~100x slower, so timing them takes many minutes and measures
    nothing the engine uses (it runs float32 there)."""
    return list(DTYPES) if has_fast_bf16() else ["float32"]


def measure(quick: bool = False, names: list[str] | None = None) -> dict:
    chunks, min_chunk_s = (3, 0.1) if quick else (5, 0.25)
    results = {}
    for name in names or default_dtypes():
        dtype = DTYPES[name]
        rows = [matmul_gflops(dtype, s, chunks, min_chunk_s, backend)
                for backend in backends() for s in SHAPES]
        results[name] = {"peak_gflops": max(r["best_gflops"] for r in rows), "shapes": rows}
    return results


def _key() -> dict:
    info = machine_info()
    return {**{k: info[k] for k in ("processor", "cpu_count", "torch", "threads")},
            "backends": backends()}


def _cached() -> dict:
    """peak.json's per-dtype figures when measured on this machine/torch/threads, else {}."""
    path = RESULTS / "peak.json"
    if path.exists():
        data = json.loads(path.read_text())
        if data.get("key") == _key():
            return data.get("dtypes", {})
    return {}


def measured_peak(dtype: str | torch.dtype = "float32", refresh: bool = False) -> float:
    """Peak dense matmul rate of this machine in `dtype`, GFLOP/s (cached in peak.json)."""
    name = {v: k for k, v in DTYPES.items()}.get(dtype, dtype)
    cached = {} if refresh else _cached()
    if name in cached:
        return cached[name]["peak_gflops"]
    return run(quick=True, names=[name])["dtypes"][name]["peak_gflops"]


def run(quick: bool = False, names: list[str] | None = None) -> dict:
    """Measure `names` (default: `default_dtypes()`), keep the best seen, write peak.json
    (dtypes not measured now keep their cached figures)."""
    before = _cached()
    dtypes = measure(quick, names)
    for name, res in dtypes.items():
        res["this_run_gflops"] = res["peak_gflops"]
        res["peak_gflops"] = max(res["peak_gflops"], before.get(name, {}).get("peak_gflops", 0))
    print(f"{'dtype':<9} {'backend':<7} {'shape (m x k x n)':<20} {'best GFLOP/s':>13} "
          f"{'median':>8}")
    for name, res in dtypes.items():
        for r in res["shapes"]:
            shape = " x ".join(map(str, r["shape"]))
            print(f"{name:<9} {r['backend']:<7} {shape:<20} {r['best_gflops']:>13.1f} "
                  f"{r['median_gflops']:>8.1f}")
    print("peak (best seen on this machine): " + ", ".join(
        f"{n} {r['peak_gflops']:.1f} GFLOP/s" for n, r in dtypes.items())
          + ("" if has_fast_bf16() else " (no AVX512-BF16/AMX: bfloat16 is emulated here and not measured unless --dtype bfloat16)"))
    payload = {"key": _key(), "quick": quick, "native_bf16": has_fast_bf16(),
               "dtypes": {**before, **dtypes}}
    write_json("peak", payload)
    return payload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer, shorter timed chunks")
    ap.add_argument("--dtype", choices=list(DTYPES), action="append",
                    help="measure only this dtype (repeatable; default: float32, and "
                         "bfloat16 where the CPU has AVX512-BF16 or AMX)")
    args = ap.parse_args()
    run(quick=args.quick, names=args.dtype)


if __name__ == "__main__":
    main()
