"""Run every benchmark, then regenerate the table in benchmarks/README.md (between the
`<!-- results:start -->` / `<!-- results:end -->` markers) and benchmarks/throughput.png.

    python benchmarks/run_all.py            # everything, ~15 min on 2 cores
    python benchmarks/run_all.py --quick    # smoke sizes, a few minutes
    python benchmarks/run_all.py --only embed classify
    python benchmarks/run_all.py --no-run   # table and plot from the JSON already there

Benchmarks run one at a time, each in its own process; a failing one is reported and the
rest still run (exit status 1 at the end).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).parent
RESULTS = HERE / "results"
README = HERE / "README.md"
PLOT = HERE / "throughput.png"
NAMES = ("peak", "bench_embed", "bench_embed_bfloat16", "bench_embed_short", "bench_embed_long",
         "bench_int8", "bench_classify", "bench_classify_given", "bench_prefix_cache",
         "bench_serve")
START, END = "<!-- results:start -->", "<!-- results:end -->"

# name -> (script, arguments, extra arguments with --quick)
STEPS = {
    "peak": ("bench_peak.py", [], ["--quick"]),
    "embed": ("bench_embed.py", [], ["--quick"]),
    "embed_bf16": ("bench_embed.py", ["--dtype", "bfloat16"], ["--quick"]),
    "embed_short": ("bench_embed.py", ["--composition", "short", "--repeats", "3"], ["--quick"]),
    "embed_long": ("bench_embed.py", ["--composition", "long", "--repeats", "3"], ["--quick"]),
    "int8": ("bench_int8.py", [], ["--texts", "128", "--repeats", "2"]),
    "classify": ("bench_classify.py", [], ["--quick"]),
    "classify_given": ("bench_classify.py", ["--baseline-order", "given", "--repeats", "3"],
                       ["--quick"]),
    "prefix_cache": ("bench_prefix_cache.py", [], ["--repeats", "2"]),
    "serve": ("bench_serve.py", [], ["--quick"]),
}


def run_steps(names: list[str], quick: bool) -> list[str]:
    failed = []
    for name in names:
        script, argv, quick_argv = STEPS[name]
        cmd = [sys.executable, str(HERE / script), *argv, *(quick_argv if quick else [])]
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        start = time.perf_counter()
        if subprocess.run(cmd).returncode != 0:
            failed.append(name)
        print(f"=== {name}: {time.perf_counter() - start:.0f} s", flush=True)
    return failed


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _int8_rows(d: dict | None) -> list[str]:
    """bench_int8: this engine's int8 and float32 beside ONNX Runtime's, with accuracy."""
    if not d:
        return []
    if d.get("skipped"):
        return [f"| bench_int8 | skipped: {d['skipped']} | | | ≥ 1.3× ONNX int8, cos ≥ 0.99 | | |"]
    rows, r = [], d["rows"]
    for name, base in (("vllm int8", "onnxruntime int8"), ("vllm float32", "onnxruntime float32")):
        e, b = r[name], r.get(base)
        if b is None:
            continue
        target, rate = "", ""
        if name == "vllm int8":
            target = "≥ 1.3× ONNX int8, min cos ≥ 0.99"
            rate = (f"projections ≥ {e['projection_gops_lower_bound']:.0f} GOP/s of "
                    f"{d['int8_peak_gops']:.0f} int8 peak")
        rows.append(
            f"| bench_int8 {name} ({d['texts']} texts) | {e['texts_per_s']:.1f} texts/s (first "
            f"pass {e['first_pass_texts_per_s']:.1f}) | {base} {b['texts_per_s']:.1f} | "
            f"**{e['texts_per_s'] / b['texts_per_s']:.2f}×** (first pass "
            f"{e['first_pass_texts_per_s'] / b['first_pass_texts_per_s']:.2f}×) | {target} | "
            f"min cos vs fp32 {e['min_cosine_vs_float32']:.4f} (ONNX "
            f"{b['min_cosine_vs_float32']:.4f}) | {rate} |")
    return rows


def table() -> str:
    """The markdown table of the latest results."""
    rows = ["| benchmark | this engine | baseline | ratio | target | accuracy "
            "| MFU engine / baseline |", "|---|---|---|---|---|---|---|"]
    peak = load("peak")
    for name, target in (("bench_embed", "MFU ≥ 90%, ≥ 1.4× ONNX"),
                         ("bench_embed_bfloat16", "MFU ≥ 75% of bf16 peak, cos ≥ 0.999"),
                         ("bench_embed_short", ""), ("bench_embed_long", "")):
        d = load(name)
        if not d:
            continue
        if d.get("skipped"):
            rows.append(f"| {name} | skipped: {d['skipped']} | | | {target} | | |")
            continue
        e, b = d["results"][d["engine"]], d["results"][d["baseline"]]
        acc = f"max 1−cos {d['max_cosine_deviation']:.1e}"
        if "min_cosine_vs_engine_float32" in d:
            acc = (f"min cos vs fp32: ST {d['min_cosine_vs_st_float32']:.5f}, "
                   f"engine {d['min_cosine_vs_engine_float32']:.5f}")
        label = (f"{name} ({d['texts']} texts, {d['words'][0]}–{d['words'][1]} words, "
                 f"{d['dtype']})")
        onnx = (f"; ONNX {d['ratio_vs_onnx']:.2f}× (first pass "
                f"{d['first_pass_ratio_vs_onnx']:.2f}×)" if "ratio_vs_onnx" in d else "")
        first = (f" (first pass {e['first_pass_texts_per_s']:.1f})"
                 if "first_pass_texts_per_s" in e else "")
        first_ratio = (f" (first pass {d['first_pass_ratio']:.2f}×)"
                       if "first_pass_ratio" in d else "")
        first_mfu = f", first pass {_pct(e['first_pass_mfu'])}" if "first_pass_mfu" in e else ""
        rows.append(f"| {label} | {e['texts_per_s']:.1f} texts/s{first}, "
                    f"{e['tokens_per_s']:.0f} tok/s | ST fp32 {b['texts_per_s']:.1f} texts/s | "
                    f"**{d['ratio']:.2f}×**{first_ratio}{onnx} | {target} | {acc} | "
                    f"{_pct(e['mfu'])}{first_mfu} / {_pct(b['mfu'])} |")
    rows += _int8_rows(load("bench_int8"))
    for d in (load("bench_classify"), load("bench_classify_given")):
        if not d:
            continue
        e, b = d["results"][d["engine"]], d["results"][d["baseline"]]
        rows.append(f"| bench_classify ({d['prompts']} prompts, {d['min_len']}–{d['max_len']} "
                    f"tokens) | {e['prompts_per_s']:.1f} prompts/s | transformers bs "
                    f"{d['batch_size']} ({d['baseline_order']}) {b['prompts_per_s']:.1f} "
                    f"prompts/s | **{d['ratio']:.2f}×** | MFU ≥ 80%, ≥ 1.5× | max Δprob "
                    f"{d['max_abs_prob_diff']:.1e} | {_pct(e['mfu'])} / {_pct(b['mfu'])} |")
    d = load("bench_prefix_cache")
    if d:
        r = d["prompts_per_s"]
        rows.append(f"| bench_prefix_cache ({d['prompts']} × {d['prefix_tokens']}+"
                    f"{d['doc_tokens']} tokens) | cache on {r['cache_on']:.1f} prompts/s | "
                    f"cache off {r['cache_off']:.1f} prompts/s | **{d['speedup']:.2f}×** | "
                    f"ideal {d['ideal_speedup']:.2f}× | max Δprob {d['max_abs_prob_diff']:.1e} "
                    f"| |")
    d = load("bench_serve")
    if d:
        res = d["results"]
        off = res["offline LLM.embed"]
        for r in (r for r in res.values() if r.get("clients")):
            c = r["clients"]
            target = "≥ 0.9×" if c == max(d["concurrency"]) else ""
            rows.append(f"| bench_serve, {c} client{'s' if c != 1 else ''} ({d['texts']} "
                        f"requests) | "
                        f"{r['requests_per_s']:.1f} req/s, p50 {r['p50_ms']:.0f} ms, "
                        f"p99 {r['p99_ms']:.0f} ms | offline {off['requests_per_s']:.1f} texts/s "
                        f"| **{r['ratio_to_offline']:.2f}×** | {target} | | "
                        f"{_pct(r['mfu'])} / {_pct(off['mfu'])} |")
        one = res.get("serve, one request")
        if one:
            top = max((r for r in res.values() if r.get("clients")), key=lambda r: r["clients"])
            rows.append(f"| bench_serve, all {d['texts']} texts in one request ({top['clients']} "
                        f"clients reach {top['ratio_to_one_request']:.2f}× of it) | "
                        f"{one['requests_per_s']:.1f} texts/s | offline "
                        f"{off['requests_per_s']:.1f} texts/s | "
                        f"**{one['ratio_to_offline']:.2f}×** | | | "
                        f"{_pct(one['mfu'])} / {_pct(off['mfu'])} |")
        s = d["short_input"]
        rows.append(f"| bench_serve, one short input, 1 client | p50 {s['serve_p50_ms']:.1f} ms "
                    f"| offline {s['offline_median_ms']:.1f} ms | **{s['ratio']:.2f}×** "
                    f"(latency) | ≤ 6 ms served, ≤ 3 ms offline | | |")
    lines = ["\n".join(rows)]
    if peak:
        lines.append("Measured peak (bench_peak; MFU above is against it): " + ", ".join(
            f"{dt} {v['peak_gflops']:.1f} GFLOP/s (this run {v['this_run_gflops']:.1f})"
            for dt, v in peak["dtypes"].items())
            + ("" if "bfloat16" in peak["dtypes"] else
               "; bfloat16 not measured (no native bfloat16 on this CPU)") + ".")
    found = [d for d in map(load, NAMES) if d]
    if found:
        m = found[0]["machine"]
        times = sorted(d["time"] for d in found)
        quick = [d["benchmark"] for d in found if d.get("quick")]
        lines.append(f"Machine: {m['processor']}, {m['cpu_count']} CPUs, torch {m['torch']}, "
                     f"{m['threads']} threads, avx512_bf16={m['avx512_bf16']}, "
                     f"amx_bf16={m['amx_bf16']}; runs from {times[0]} to {times[-1]}"
                     + (f" (**--quick** sizes: {', '.join(quick)})" if quick else "") + ".")
    return "\n\n".join(lines)


def update_readme() -> None:
    text = README.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{README} lacks the {START} / {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{table()}\n{END}{tail}")
    print(f"updated {README}")


def plot() -> None:
    """texts/s and tokens/s of this engine vs sentence-transformers, short/mixed/long."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = [(c, load(n)) for c, n in (("short", "bench_embed_short"), ("mixed", "bench_embed"),
                                       ("long", "bench_embed_long"))]
    runs = [(c, d) for c, d in runs if d and not d.get("skipped")]
    if not runs:
        print("no bench_embed results to plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.38
    for ax, key, unit in ((axes[0], "texts_per_s", "texts/s"), (axes[1], "tokens_per_s",
                                                                 "tokens/s")):
        for j, (who, color) in enumerate((("engine", "tab:blue"), ("baseline", "tab:gray"))):
            xs = [i + (j - 0.5) * width for i in range(len(runs))]
            ys = [d["results"][d[who]][key] for _, d in runs]
            label = runs[0][1][who]
            bars = ax.bar(xs, ys, width, label=label, color=color)
            if who == "engine":
                for bar, (_, d) in zip(bars, runs):
                    ax.annotate(f"{d['ratio']:.2f}×", (bar.get_x() + bar.get_width() / 2,
                                                       bar.get_height()),
                                ha="center", va="bottom", fontsize=9)
        ax.set_xticks(range(len(runs)))
        ax.set_xticklabels([f"{c}\n{d['words'][0]}–{d['words'][1]} words\n"
                            f"{d['tokens'] / d['texts']:.0f} tok/text" for c, d in runs])
        ax.set_ylabel(unit)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
        ax.set_title(f"MiniLM embedding throughput ({unit})")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=9, frameon=False)
    m = runs[0][1]["machine"]
    fig.suptitle(f"{m['threads']} CPU threads, torch {m['torch']}; ratio = this engine ÷ "
                 "sentence-transformers (batch 32), interleaved in the same run", fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)
    print(f"wrote {PLOT}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="pass each benchmark its smoke size")
    ap.add_argument("--only", nargs="+", choices=STEPS, help="run just these")
    ap.add_argument("--skip", nargs="+", choices=STEPS, default=[], help="leave these out")
    ap.add_argument("--no-run", action="store_true", help="only redo the table and the plot")
    args = ap.parse_args()
    failed = []
    if not args.no_run:
        names = [n for n in (args.only or STEPS) if n not in args.skip]
        failed = run_steps(names, args.quick)
    update_readme()
    plot()
    if failed:
        print(f"failed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
