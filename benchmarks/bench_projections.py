"""Few-row projections: the C++ kernel on oneDNN's packed weights vs oneDNN itself.

MiniLM's 24 projections (6 layers x [384->1152, 384->384, 384->1536, 1536->384], each with
its own random weight, 42 MB in all: more than the caches, so every pass streams the
weights from memory), float32, with bias. For each row count: the kernel
(`layers.skinny_gemm`) and `torch.ops.mkldnn._linear_pointwise` on the same packed
weights, interleaved, median of `--repeats`. "cached" repeats one row count (oneDNN's
primitive for it is built once); "fresh" shifts the row count by one every pass (rows,
rows + 1, ... rows + 96), so oneDNN builds a primitive per pass, as a server meets new step
sizes. Any build that has the kernel (AVX2, AVX-512), used by the engine or not. Writes
results/bench_projections.json.

    python benchmarks/bench_projections.py [--rows 1,9,16,32,64] [--repeats 30]
"""
from __future__ import annotations

import argparse
import itertools
import pathlib
import sys

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process)
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import interleave, machine_info, median, write_json  # noqa: E402

SHAPES = [(384, 1152), (384, 384), (384, 1536), (1536, 384)]  # (in, out) per layer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,9,16,32,64")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()

    from vllm._kernels.cpu_kernels import skinny_gemm_kernel
    from vllm.model_executor.layers.linear import pack_weight
    from vllm.model_executor.layers.skinny_gemm import skinny_weight
    kernel = skinny_gemm_kernel(engine=False)  # any build that has it: measure it here
    if kernel is None:
        print("skip: no build of the few-row kernel here (it needs AVX2 or AVX-512)")
        write_json("bench_projections", {"skipped": "no build of the kernel"})
        return
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        for k, n in SHAPES:
            weight = torch.randn(n, k) / k ** 0.5
            packed = pack_weight(weight)
            layers.append((k, n, packed, torch.randn(n), skinny_weight(kernel, packed, weight)))
    assert all(sw is not None for *_, sw in layers), "oneDNN's layout is not the kernel's"
    onednn = torch.ops.mkldnn._linear_pointwise

    def model_pass(use_kernel: bool, rows_of):
        def run():
            m = rows_of()
            xs = {384: torch.randn(m, 384), 1536: torch.randn(m, 1536)}
            for k, n, packed, bias, sw in layers:
                if use_kernel:
                    sw(xs[k], bias)
                else:
                    onednn(xs[k], packed, bias, "none", [], "")
        return run

    results = {}
    print(f"CPU: {machine_info()['processor']}, {torch.get_num_threads()} threads; "
          f"24 projections, 42 MB of weights per pass")
    print(f"{'rows':>12} {'kernel ms':>10} {'oneDNN ms':>10} {'ratio':>6}")
    for rows in [int(r) for r in args.rows.split(",")]:
        for kind in ("cached", "fresh"):
            counter = itertools.count()
            rows_of = (lambda r=rows: r) if kind == "cached" else \
                (lambda r=rows, c=counter: r + next(c) % 97)
            times = interleave({"kernel": model_pass(True, rows_of),
                                "onednn": model_pass(False, rows_of)}, args.repeats)
            k_ms, o_ms = (1e3 * median(times[name]) for name in ("kernel", "onednn"))
            label = f"{rows}" if kind == "cached" else f"{rows}-{rows + 96} new"
            results[f"{rows} {kind}"] = {"kernel_ms": k_ms, "onednn_ms": o_ms,
                                         "ratio": o_ms / k_ms}
            print(f"{label:>12} {k_ms:>10.2f} {o_ms:>10.2f} {o_ms / k_ms:>5.2f}x")
    write_json("bench_projections", {"repeats": args.repeats, "shapes": SHAPES,
                                     "layers": 6, "results": results})


if __name__ == "__main__":
    main()
