"""Embedding throughput: this engine vs sentence-transformers on the bundled MiniLM.

512 English-looking texts (8-200 words, uniform, fixed seed; at most ~230 MiniLM tokens so
nothing is truncated at max_seq_length=256) through all-MiniLM-L6-v2, both in this process:
`LLM(dir).embed(texts)` vs `SentenceTransformer(dir, device="cpu").encode(texts,
batch_size=32)` (which sorts by length and pads each batch). Interleaved runs, medians.
Prints texts/s, tokens/s (real tokens, specials included, no padding), the ratio, the
largest cosine deviation (1 - cos) between the two outputs, and the model FLOP utilisation
of both (common.FLOP_FORMULA, against bench_peak's measured peak for the dtype).

`--dtype bfloat16` runs this engine in bfloat16 (only on CPUs with AVX512-BF16 or AMX;
elsewhere it prints a skip line) against float32 sentence-transformers, and reports its
cosine against the float32 outputs. `--composition short|long` swaps the text mix (8-32
or 150-200 words) for the throughput plot.

    python benchmarks/bench_embed.py [--dtype bfloat16] [--composition mixed] [--quick]

Writes results/bench_embed[_COMPOSITION][_bfloat16].json.
"""
from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process, as a user's script gets)
import numpy as np
from vllm.attention.backends import cpu_native

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_peak import measured_peak  # noqa: E402
from common import (FLOP_FORMULA, block_linear_params, empty_prefix_cache,  # noqa: E402
                    has_fast_bf16, interleave, machine_info, make_texts, median, minilm_dir,
                    model_flops, timed, warn_if_over_peak, write_json)

COMPOSITIONS = {"short": (8, 32), "mixed": (8, 200), "long": (150, 200)}
MAX_SEQ = 256


def result_name(composition: str, dtype: str) -> str:
    return "bench_embed" + ("" if composition == "mixed" else f"_{composition}") + \
        ("" if dtype == "float32" else f"_{dtype}")


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def vectors(outputs) -> np.ndarray:
    return np.array([o.outputs.embedding for o in outputs], dtype=np.float64)


def token_lengths(tokenizer, texts: list[str]) -> list[int]:
    return [len(ids) for ids in tokenizer(texts, truncation=True,
                                          max_length=MAX_SEQ)["input_ids"]]


@contextlib.contextmanager
def without_bf16_attention():
    """CPU_NATIVE as it is where the CPU has no AVX512-BF16: bfloat16 q/k/v cast to float32
    for the float32 kernel."""
    kernel = cpu_native.varlen_attention_bf16_kernel
    cpu_native.varlen_attention_bf16_kernel = lambda: None
    try:
        yield
    finally:
        cpu_native.varlen_attention_bf16_kernel = kernel


def first_passes(encoders: dict, args, flops_of) -> dict[str, dict]:
    """One pass per setting over texts none of them has seen (new token counts, so every
    per-shape cost a server pays shows up), `args.repeats` fresh sets, interleaved;
    median texts/s and model GFLOP/s per setting."""
    rates: dict[str, list[tuple[float, float]]] = {label: [] for label in encoders}
    for r in range(args.repeats):
        batch = make_texts(args.texts, *COMPOSITIONS[args.composition],
                           seed=args.seed + 1000 + r)
        flops = flops_of(batch)
        for label, encode in encoders.items():
            sec = timed(lambda: encode(batch))
            rates[label].append((len(batch) / sec, flops / sec / 1e9))
    return {label: {"texts_per_s": median([t for t, _ in v]),
                    "gflops": median([g for _, g in v])} for label, v in rates.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--composition", choices=COMPOSITIONS, default="mixed")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="this engine's dtype (sentence-transformers stays float32)")
    ap.add_argument("--batch-size", type=int, default=32, help="sentence-transformers' batch")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-onnx", action="store_true",
                    help="skip the onnxruntime baseline (float32 engine runs only)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 128 texts, 3 repeats")
    args = ap.parse_args()
    if args.quick:
        args.texts, args.repeats = min(args.texts, 128), min(args.repeats, 3)
    name = result_name(args.composition, args.dtype)
    if args.dtype == "bfloat16" and not has_fast_bf16():
        print("skip: bfloat16 needs AVX512-BF16 or AMX (not in /proc/cpuinfo flags)")
        write_json(name, {"skipped": "no avx512_bf16 / amx_bf16 on this CPU"})
        return

    import torch
    from sentence_transformers import SentenceTransformer
    from vllm import LLM

    model_dir = minilm_dir()
    texts = make_texts(args.texts, *COMPOSITIONS[args.composition], seed=args.seed)
    st = SentenceTransformer(str(model_dir), device="cpu")
    assert st.max_seq_length == MAX_SEQ, st.max_seq_length
    lengths = [len(ids) for ids in st.tokenizer(texts, truncation=True,
                                                max_length=MAX_SEQ)["input_ids"]]
    truncated = sum(len(ids) > MAX_SEQ for ids in st.tokenizer(texts)["input_ids"])
    bert = st[0].auto_model
    cfg = bert.config
    flops = model_flops(lengths, block_linear_params(bert.encoder), cfg.num_hidden_layers,
                        cfg.hidden_size)
    llm = LLM(str(model_dir), dtype=args.dtype)

    engine = f"vllm ({args.dtype})"
    baseline = "sentence-transformers (float32)"
    onnx = "onnxruntime (float32)"

    def run_engine(batch: list[str]):
        empty_prefix_cache(llm)   # no reuse of the previous run's blocks
        return llm.embed(batch, use_tqdm=False)

    encoders = {engine: run_engine,
                baseline: lambda batch: st.encode(batch, batch_size=args.batch_size)}
    f32_attention = f"vllm ({args.dtype}, float32 attention)"
    if args.dtype == "bfloat16" and cpu_native.varlen_attention_bf16_kernel() is not None:
        # the same engine with its attention as before the bfloat16 kernel: q/k/v cast to
        # float32 for the float32 kernel (a same-run A/B of csrc/varlen_attention_bf16.cpp)
        def run_f32_attention(batch: list[str]):
            with without_bf16_attention():
                return run_engine(batch)
        encoders[f32_attention] = run_f32_attention
    extra = {}
    if not args.no_onnx:
        from onnx_baseline import OnnxEmbedder, missing
        if missing():
            print(f"onnxruntime baseline skipped: no {missing()} (pip install -e .[bench])")
        else:
            ort = OnnxEmbedder(model_dir, MAX_SEQ, torch.get_num_threads())
            encoders[onnx] = lambda batch: ort.encode(batch, batch_size=args.batch_size)
    runs = {label: (lambda f=f: f(texts)) for label, f in encoders.items()}
    ours, ref = vectors(runs[engine]()), runs[baseline]()   # warm-up + equality check
    cos_ref = cosines(ours, ref)
    if onnx in runs:
        extra["max_cosine_deviation_onnx_vs_st"] = float(1 - cosines(runs[onnx](), ref).min())
    own_fp32 = "vllm (float32)"
    if args.dtype != "float32":   # also against this engine's own float32: output and speed
        fp32 = LLM(str(model_dir), dtype="float32")
        cos_own = cosines(ours, vectors(fp32.embed(texts, use_tqdm=False)))
        extra.update({"min_cosine_vs_st_float32": float(cos_ref.min()),
                      "min_cosine_vs_engine_float32": float(cos_own.min()),
                      "mean_cosine_vs_engine_float32": float(cos_own.mean())})
        if f32_attention in encoders:
            with without_bf16_attention():
                before = cosines(vectors(llm.embed(texts, use_tqdm=False)),
                                 vectors(fp32.embed(texts, use_tqdm=False)))
            extra["min_cosine_vs_engine_float32_with_float32_attention"] = float(before.min())

        def run_fp32(batch: list[str]):
            empty_prefix_cache(fp32)
            return fp32.embed(batch, use_tqdm=False)
        encoders[own_fp32] = run_fp32
        runs[own_fp32] = lambda: run_fp32(texts)

    times = interleave(runs, args.repeats)
    fresh = first_passes(encoders, args, flops_of=lambda batch: (
        model_flops(token_lengths(st.tokenizer, batch), block_linear_params(bert.encoder),
                    cfg.num_hidden_layers, cfg.hidden_size)))
    peak = {label: measured_peak(args.dtype if label in (engine, f32_attention) else "float32")
            for label in runs}
    n_tok = sum(lengths)
    rows = {}
    for label, t in times.items():
        sec = median(t)
        rows[label] = {"texts_per_s": len(texts) / sec, "tokens_per_s": n_tok / sec,
                       "model_gflops": flops / sec / 1e9, "peak_gflops": peak[label],
                       "mfu": flops / sec / 1e9 / peak[label]}
        first = fresh[label]
        rows[label]["first_pass_texts_per_s"] = first["texts_per_s"]
        rows[label]["first_pass_mfu"] = first["gflops"] / peak[label]
    ratio = rows[engine]["texts_per_s"] / rows[baseline]["texts_per_s"]
    if own_fp32 in rows:
        extra["ratio_vs_engine_float32"] = (rows[engine]["texts_per_s"]
                                            / rows[own_fp32]["texts_per_s"])
        extra["first_pass_ratio_vs_engine_float32"] = (
            rows[engine]["first_pass_texts_per_s"] / rows[own_fp32]["first_pass_texts_per_s"])
    if f32_attention in rows:
        extra["ratio_bf16_attention_vs_float32_attention"] = (
            rows[engine]["texts_per_s"] / rows[f32_attention]["texts_per_s"])
        extra["ratio_vs_engine_float32_with_float32_attention"] = (
            rows[f32_attention]["texts_per_s"] / rows[own_fp32]["texts_per_s"])
    if onnx in rows:
        extra["ratio_vs_onnx"] = rows[engine]["texts_per_s"] / rows[onnx]["texts_per_s"]
        extra["first_pass_ratio_vs_onnx"] = (rows[engine]["first_pass_texts_per_s"]
                                             / rows[onnx]["first_pass_texts_per_s"])
    extra["first_pass_ratio"] = (rows[engine]["first_pass_texts_per_s"]
                                 / rows[baseline]["first_pass_texts_per_s"])
    max_dev = float(1 - cos_ref.min())

    print(f"{len(texts)} texts ({args.composition}, {COMPOSITIONS[args.composition][0]}-"
          f"{COMPOSITIONS[args.composition][1]} words), {n_tok} tokens "
          f"(mean {n_tok / len(texts):.0f}, max {max(lengths)}, truncated {truncated}), "
          f"{flops / 1e12:.2f} model TFLOP per pass, {args.repeats} interleaved repeats")
    print(f"CPU: {machine_info()['processor']}, peak float32 {peak[baseline]:.1f} GFLOP/s"
          + (f", {args.dtype} {peak[engine]:.1f}" if args.dtype != "float32" else ""))
    print(f"{'setting':<36} {'texts/s':>8} {'tokens/s':>9} {'GFLOP/s':>8} {'MFU':>6} "
          f"{'first pass texts/s':>19} {'MFU':>6}")
    for label, r in rows.items():
        print(f"{label:<36} {r['texts_per_s']:>8.1f} {r['tokens_per_s']:>9.0f} "
              f"{r['model_gflops']:>8.1f} {100 * r['mfu']:>5.1f}% "
              f"{r['first_pass_texts_per_s']:>19.1f} {100 * r['first_pass_mfu']:>5.1f}%")
    line = f"ratio {ratio:.2f}x (first pass {extra['first_pass_ratio']:.2f}x)"
    if "ratio_vs_onnx" in extra:
        line += (f"; vs onnxruntime {extra['ratio_vs_onnx']:.2f}x (first pass "
                 f"{extra['first_pass_ratio_vs_onnx']:.2f}x)")
    line += f"; max cosine deviation vs sentence-transformers {max_dev:.2e}"
    if "min_cosine_vs_engine_float32" in extra:
        line += (f"; vs this engine in float32 {extra['ratio_vs_engine_float32']:.2f}x "
                 f"(first pass {extra['first_pass_ratio_vs_engine_float32']:.2f}x), min "
                 f"cosine {extra['min_cosine_vs_engine_float32']:.6f}")
    print(line)
    if "ratio_bf16_attention_vs_float32_attention" in extra:
        print(f"bfloat16 attention kernel vs float32 attention (same run): "
              f"{extra['ratio_bf16_attention_vs_float32_attention']:.3f}x; min cosine to "
              f"float32 before {extra['min_cosine_vs_engine_float32_with_float32_attention']:.6f}")
    warn_if_over_peak({k: r["mfu"] for k, r in rows.items()})
    write_json(name, {
        "texts": len(texts), "composition": args.composition,
        "words": list(COMPOSITIONS[args.composition]), "seed": args.seed,
        "tokens": n_tok, "max_tokens": max(lengths), "truncated": truncated,
        "dtype": args.dtype, "baseline_dtype": "float32", "batch_size": args.batch_size,
        "repeats": args.repeats, "quick": args.quick,
        "model_tflop_per_pass": flops / 1e12, "flop_formula": FLOP_FORMULA,
        "seconds": times, "results": rows, "engine": engine, "baseline": baseline, "ratio": ratio,
        "max_cosine_deviation": max_dev, **extra})


if __name__ == "__main__":
    main()
