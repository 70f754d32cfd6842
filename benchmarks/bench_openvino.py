"""The CPU race on MiniLM: this engine vs OpenVINO and ONNX Runtime, float32 and int8.

Six encoders of the bundled all-MiniLM-L6-v2 on the same 512 texts of 8-200 words (the
seed and mix of bench_embed / bench_int8), batches of 32 for every peer:

* this engine, `LLM(dir)` (float32) and `LLM(dir, quantization="int8")`;
* ONNX Runtime float32 and dynamic int8, as bench_int8 runs them (onnx_baseline.py);
* OpenVINO float32 and NNCF static int8 through sentence-transformers' `backend="openvino"`
  (openvino_baseline.py, in a worker process: optimum-intel may need other transformers /
  huggingface_hub versions than the project's; `--ov-python` names the interpreter).

Timing: every encoder embeds one batch untimed (warm-up), then `--repeats` interleaved
rounds over the texts (the starting encoder rotates each round; the first round's outputs
are the accuracy figures), medians; then a first pass per encoder on each of
`--first-passes` sets of texts none has seen (new token counts), interleaved, median. Each
encoder's own encode call is timed (the worker times its own, so the pipe is not counted).

Accuracy against this engine's float32: min and mean cosine over the texts, and the
Spearman correlation of 20,000 random pairs' cosines (the similarity ranking an STS score is
read from). MFU (common.FLOP_FORMULA over real tokens, against bench_peak's float32 peak)
for the float32 encoders; model GOP/s for all. NNCF calibrates on `--calibration` texts of
the same generator and mix with another seed (not the timed texts).

    python benchmarks/bench_openvino.py [--texts 512] [--repeats 5] [--ov-python PY]

Writes results/bench_openvino.json.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Callable, Optional

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process)
import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_int8 import onnx_int8, ranking_spearman  # noqa: E402
from bench_peak import measured_peak  # noqa: E402
from common import (FLOP_FORMULA, block_linear_params, cpu_flags, empty_prefix_cache,  # noqa: E402
                    machine_info, make_texts, median, minilm_dir, model_flops, write_json)
from onnx_baseline import OnnxEmbedder, missing  # noqa: E402
from openvino_baseline import OpenVinoWorker, timed_call, worker_python_problem  # noqa: E402

MAX_SEQ = 256
ISA = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
       "avx512_fp16", "amx_bf16", "amx_int8")
# texts -> (wall seconds, CPU seconds, embeddings)
Encoder = Callable[[list[str]], tuple[float, float, np.ndarray]]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def engine_encoder(llm) -> Encoder:
    def encode(texts: list[str]) -> tuple[float, float, np.ndarray]:
        empty_prefix_cache(llm)   # no reuse of an earlier run's blocks
        return timed_call(lambda: np.array(
            [o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)]))
    return encode


def onnx_encoder(ort: OnnxEmbedder, batch_size: int) -> Encoder:
    def encode(texts: list[str]) -> tuple[float, float, np.ndarray]:
        return timed_call(lambda: ort.encode(texts, batch_size))
    return encode


def build_encoders(args, model_dir: pathlib.Path,
                   threads: int) -> tuple[dict, dict, Optional[OpenVinoWorker]]:
    """name -> Encoder, the settings / skips to report, and the OpenVINO worker (if any)."""
    from vllm import LLM
    from vllm.platforms import current_platform
    info: dict = {"skipped": {}}
    try:
        info["vllm_int8_path"] = list(current_platform.int8_path())
    except ValueError as exc:
        info["vllm_int8_path"] = str(exc)
    encoders: dict[str, Encoder] = {"vllm float32": engine_encoder(LLM(str(model_dir)))}
    try:
        encoders["vllm int8"] = engine_encoder(LLM(str(model_dir), quantization="int8"))
    except ValueError as exc:   # a CPU the int8 path refuses
        info["skipped"]["vllm int8"] = str(exc)
    if args.no_onnx or missing():
        info["skipped"]["onnxruntime"] = "--no-onnx" if args.no_onnx else f"no {missing()}"
    else:
        import onnxruntime
        info["onnxruntime"] = onnxruntime.__version__
        encoders["onnxruntime float32"] = onnx_encoder(
            OnnxEmbedder(model_dir, MAX_SEQ, threads), args.batch_size)
        encoders["onnxruntime int8"] = onnx_encoder(onnx_int8(model_dir, threads),
                                                    args.batch_size)
    problem = worker_python_problem(args.ov_python)
    if problem:
        info["skipped"]["openvino"] = f"{args.ov_python}: {problem}"
        return encoders, info, None
    ov = OpenVinoWorker(args.ov_python)
    calibration = make_texts(args.calibration, 8, 200, seed=2) if args.calibration else None
    info["openvino"] = ov.setup(model_dir, threads, MAX_SEQ, calibration, args.ov_default_hint)
    info["openvino"]["calibration_texts"] = args.calibration
    for name in info["openvino"]["compiled"]:
        encoders[f"openvino {name}"] = (
            lambda texts, n=name: ov.encode(n, texts, args.batch_size))
    return encoders, info, ov


def rotated(names: list[str], r: int) -> list[str]:
    """Round r's order: each encoder starts a round in turn."""
    return names[r % len(names):] + names[:r % len(names)]


def run_all(encoders: dict[str, Encoder], args, texts: list[str]) -> dict:
    """One untimed batch each (warm-up), interleaved repeats on `texts` (the first one's
    outputs are the accuracy figures), then first passes on unseen texts."""
    for enc in encoders.values():
        enc(texts[:args.batch_size])
    names = list(encoders)
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    outputs: dict[str, np.ndarray] = {}
    for r in range(args.repeats):
        for name in rotated(names, r):
            wall, cpu, out = encoders[name](texts)
            times[name].append((wall, cpu))
            outputs.setdefault(name, out)
    first: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    first_sets = []
    for r in range(args.first_passes):
        batch = make_texts(len(texts), 8, 200, seed=1000 + r)
        first_sets.append(batch)
        for name in rotated(names, r):
            first[name].append(encoders[name](batch)[:2])
    return {"outputs": outputs, "times": times, "first": first, "first_sets": first_sets}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--first-passes", type=int, default=3, help="unseen text sets")
    ap.add_argument("--batch-size", type=int, default=32, help="every peer's batch")
    ap.add_argument("--calibration", type=int, default=300,
                    help="NNCF calibration texts (0: no OpenVINO int8)")
    ap.add_argument("--ov-python", default=sys.executable,
                    help="interpreter with openvino, nncf and optimum-intel (worker)")
    ap.add_argument("--ov-default-hint", action="store_true",
                    help="also OpenVINO with its default precision hint (bf16 on CPUs with "
                         "AVX512-BF16 / AMX)")
    ap.add_argument("--no-onnx", action="store_true", help="leave ONNX Runtime out")
    ap.add_argument("--quick", action="store_true", help="smoke run: 128 texts, 2 repeats")
    args = ap.parse_args()
    if args.quick:
        args.texts, args.repeats = min(args.texts, 128), min(args.repeats, 2)
        args.first_passes = min(args.first_passes, 1)
    from transformers import AutoModel, AutoTokenizer
    model_dir = minilm_dir()
    threads = torch.get_num_threads()
    texts = make_texts(args.texts, 8, 200, seed=0)
    encoders, info, ov = build_encoders(args, model_dir, threads)
    for name, why in info["skipped"].items():
        print(f"{name} skipped: {why}")
    run = run_all(encoders, args, texts)
    if ov is not None:
        ov.close()
    bert = AutoModel.from_pretrained(str(model_dir))
    tok = AutoTokenizer.from_pretrained(str(model_dir))

    def flops_of(batch: list[str]) -> float:
        lengths = [len(i) for i in tok(batch, truncation=True, max_length=MAX_SEQ)["input_ids"]]
        return model_flops(lengths, block_linear_params(bert.encoder),
                           bert.config.num_hidden_layers, bert.config.hidden_size)
    rows = figures(run, texts, flops_of, measured_peak("float32"))
    report(rows, args, texts, info, threads, flops_of(texts))


def speed(times: list[tuple[float, float]], n: int, flops: list[float], peak: float,
          is_float: bool) -> dict:
    """Median texts/s (wall), best texts/s, median texts per CPU-second, model GOP/s and,
    for a float32 encoder, MFU; `flops[i]` is the work of pass i."""
    row = {"texts_per_s": median([n / w for w, _ in times]),
           "best_texts_per_s": max(n / w for w, _ in times),
           "texts_per_cpu_s": median([n / c for _, c in times]),
           "model_gops": median([f / w / 1e9 for f, (w, _) in zip(flops, times)]),
           "seconds": [w for w, _ in times], "cpu_seconds": [c for _, c in times]}
    if is_float:
        row["mfu"] = row["model_gops"] / peak
    return row


def figures(run: dict, texts: list[str], flops_of, peak: float) -> dict[str, dict]:
    """Per encoder: speed (repeats, first passes), ratios to this engine, accuracy to this
    engine's float32."""
    ref = run["outputs"]["vllm float32"]
    pairs = np.random.default_rng(0).integers(0, len(texts), (20000, 2))
    flops = [flops_of(texts)] * len(next(iter(run["times"].values())))
    first_flops = [flops_of(b) for b in run["first_sets"]]
    rows = {}
    for name, out in run["outputs"].items():
        is_float = "int8" not in name
        row = speed(run["times"][name], len(texts), flops, peak, is_float)
        if run["first"][name]:
            first = speed(run["first"][name], len(texts), first_flops, peak, is_float)
            row.update({f"first_pass_{k}": v for k, v in first.items()})
        cos = cosines(out, ref)
        row.update({"min_cosine_vs_vllm_float32": float(cos.min()),
                    "mean_cosine_vs_vllm_float32": float(cos.mean()),
                    "similarity_rank_spearman": ranking_spearman(out, ref, pairs)})
        rows[name] = row
    for base in ("vllm float32", "vllm int8"):
        for key in ("texts_per_s", "first_pass_texts_per_s", "texts_per_cpu_s"):
            for row in rows.values():
                if base in rows and key in row:
                    row[f"{key}_ratio_vs_{base.replace(' ', '_')}"] = \
                        row[key] / rows[base][key]
    return rows


def goals(rows: dict[str, dict]) -> dict[str, float]:
    """Issue 39 item 1's same-run ratios: this engine over its peers (above 1: ahead), on
    the median wall time, the first pass and the CPU seconds."""
    out = {}
    keys = ("texts_per_s", "first_pass_texts_per_s", "texts_per_cpu_s")
    ours, theirs = rows.get("vllm float32"), rows.get("openvino float32")
    for key in keys:
        if ours and theirs and key in ours and key in theirs:
            out[f"vllm_float32_over_openvino_float32 ({key})"] = ours[key] / theirs[key]
    peers = [rows[n] for n in ("openvino int8", "onnxruntime int8") if n in rows]
    for key in keys:
        if "vllm int8" in rows and peers and all(key in r for r in peers):
            out[f"vllm_int8_over_fastest_peer_int8 ({key})"] = (
                rows["vllm int8"][key] / max(r[key] for r in peers))
    return out


def report(rows: dict, args, texts: list[str], info: dict, threads: int, flops: float) -> None:
    flags = sorted(cpu_flags() & set(ISA))
    peak = measured_peak("float32")
    print(f"CPU: {machine_info()['processor']}, {threads} threads; ISA: {', '.join(flags)}; "
          f"float32 peak {peak:.1f} GFLOP/s (bench_peak, best seen); this engine's int8 "
          f"path: {info.get('vllm_int8_path')}")
    print(f"{len(texts)} texts, {flops / 1e12:.2f} model TFLOP per pass, batch {args.batch_size}, "
          f"{args.repeats} interleaved repeats, {args.first_passes} first-pass sets")
    print(f"{'encoder':<40} {'texts/s':>7} {'best':>6} {'/vf32':>6} {'/vi8':>6} {'first':>6} "
          f"{'/vf32':>6} {'/vi8':>6} {'/cpu-s':>6} {'/vf32':>6} {'/vi8':>6} {'MFU':>6} "
          f"{'min cos':>8} {'mean cos':>8} {'rank rho':>8}")
    for name, r in rows.items():
        mfu = f"{100 * r['mfu']:5.1f}%" if "mfu" in r else "-"
        cells = [r["texts_per_s"], r["best_texts_per_s"]]
        for key in ("texts_per_s", "first_pass_texts_per_s", "texts_per_cpu_s"):
            if key != "texts_per_s":
                cells.append(r.get(key, float("nan")))
            cells += [r.get(f"{key}_ratio_vs_vllm_float32", float("nan")),
                      r.get(f"{key}_ratio_vs_vllm_int8", float("nan"))]
        print(f"{name:<40} {cells[0]:>7.1f} {cells[1]:>6.1f} {cells[2]:>6.2f} {cells[3]:>6.2f} "
              f"{cells[4]:>6.1f} {cells[5]:>6.2f} {cells[6]:>6.2f} {cells[7]:>6.1f} "
              f"{cells[8]:>6.2f} {cells[9]:>6.2f} {mfu:>6} "
              f"{r['min_cosine_vs_vllm_float32']:>8.5f} {r['mean_cosine_vs_vllm_float32']:>8.5f} "
              f"{r['similarity_rank_spearman']:>8.5f}")
    print("columns: median texts/s, best, ratio to this engine's float32 / int8; first pass "
          "on unseen texts, ratios; texts per CPU-second of the encoder's process, ratios")
    ratios = goals(rows)
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}x")
    write_json("bench_openvino", {
        "texts": len(texts), "words": [8, 200], "seed": 0, "batch_size": args.batch_size,
        "repeats": args.repeats, "first_passes": args.first_passes, "quick": args.quick,
        "threads": threads, "isa_flags": flags, "float32_peak_gflops": peak,
        "model_tflop_per_pass": flops / 1e12, "flop_formula": FLOP_FORMULA,
        "calibration": {"texts": args.calibration, "seed": 2, "words": [8, 200]},
        "settings": info, "rows": rows, "goals": ratios})


if __name__ == "__main__":
    main()
