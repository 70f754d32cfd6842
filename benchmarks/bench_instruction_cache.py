"""Qwen3-Embedding-style instructions that cost (almost) nothing: prefix caching.

Queries are embedded as `Instruct: <task>\\nQuery: <query>` (the instruction passed as the
raw `prompt` prefix, 60 tokens with [CLS]) by a ~40M-parameter random Qwen3ForCausalLM
(LAST pooling, causal: prefix caching on). Three runs of short queries, fresh
in every repeat (only the instruction may be a cache hit):
- `plain`: the queries alone (no instruction);
- `cached`: with the instruction, its blocks already cached (a serving steady state);
- `uncached`: with the instruction, prefix caching off.
Prints queries/s and the cost ratios cached/plain (target <= 1.2x; also the median of
the per-repeat paired ratios) and uncached/plain, for block_size 16 (vLLM's default:
60 = 3 full blocks + 12 tokens, the partial block's run is copied into each query's own
block) and block_size 4 (whole blocks only). Writes results/bench_instruction_cache.json.

    python benchmarks/bench_instruction_cache.py [--repeats 3] [--queries 128]
"""
from __future__ import annotations

import argparse
import pathlib
import random
import sys
import tempfile

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process, as a user's script gets)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import build_causal_classifier, median, timed, write_json  # noqa: E402

from vllm import LLM  # noqa: E402

TASK = ("Given a web search query written by a user, retrieve the relevant passages that "
        "answer the query, ranking documents")
WORDS = ("cheap flights paris weather today python list sort best pizza near me how tall "
         "is everest river nile length vaccine side effects bitcoin price news").split()
INSTRUCTION_TOKENS = 60


def instruction(tokenizer) -> str:
    """`Instruct: <task>\\nQuery: ` grown word by word to INSTRUCTION_TOKENS tokens."""
    words = TASK.split()
    extra = iter(("and", "cite", "sources", "in", "full") * 20)
    while True:
        text = f"Instruct: {' '.join(words)}\nQuery: "
        n = len(tokenizer(text, add_special_tokens=True)["input_ids"]) - 1  # without [SEP]
        if n >= INSTRUCTION_TOKENS:
            return text
        words.append(next(extra))


def queries(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6))) for _ in range(n)]


def measure(model_dir: pathlib.Path, block: int, texts: list[str], repeats: int) -> dict:
    on = LLM(str(model_dir), block_size=block, enable_prefix_caching=True)
    off = LLM(str(model_dir), block_size=block, enable_prefix_caching=False)
    prefix = instruction(on.get_tokenizer())
    runs = {"plain": lambda qs: on.embed(qs, use_tqdm=False, prompt=""),
            "cached": lambda qs: on.embed(qs, use_tqdm=False, prompt=prefix),
            "uncached": lambda qs: off.embed(qs, use_tqdm=False, prompt=prefix)}
    for run in runs.values():  # warm-up; leaves the instruction's blocks cached
        run(texts)
    a = runs["cached"](texts)
    b = runs["uncached"](texts)
    diff = max(abs(x - y) for p, q in zip(a, b)
               for x, y in zip(p.outputs.embedding, q.outputs.embedding))
    # Each repeat embeds queries no run has seen, so only the instruction can be a cache
    # hit (repeating the same queries would let every setting hit its own earlier run).
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(repeats):
        fresh = queries(len(texts), seed=1 + r)
        for name, run in runs.items():
            times[name].append(timed(lambda: run(fresh)))
    rate = {name: len(texts) / median(t) for name, t in times.items()}
    tokens = {"instruction": len(on.get_tokenizer()(prefix)["input_ids"]) - 1,
              "mean_query": sum(len(o.prompt_token_ids) for o in a) / len(a)}
    return {"block_size": block, "seconds": times, "queries_per_s": rate, "tokens": tokens,
            "cached_over_plain": rate["plain"] / rate["cached"],
            # Paired per repeat (plain and cached ran back to back): robust to load swings.
            "cached_over_plain_paired_median": median(
                [c / p for c, p in zip(times["cached"], times["plain"])]),
            "uncached_over_plain": rate["plain"] / rate["uncached"],
            "max_abs_diff_cached_vs_uncached": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--queries", type=int, default=128)
    ap.add_argument("--block-sizes", type=int, nargs="+", default=[16, 4])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_instr_") as tmp:
        model_dir = build_causal_classifier(pathlib.Path(tmp) / "qwen3_embed_40m",
                                            head="ForCausalLM")
        texts = queries(args.queries)
        results = [measure(model_dir, block, texts, args.repeats) for block in args.block_sizes]
    print(f"{'block':>5} {'plain q/s':>10} {'cached q/s':>11} {'uncached q/s':>13} "
          f"{'cached/plain':>13} {'paired':>7} {'uncached/plain':>15}")
    for r in results:
        q = r["queries_per_s"]
        print(f"{r['block_size']:>5} {q['plain']:>10.1f} {q['cached']:>11.1f} "
              f"{q['uncached']:>13.1f} {r['cached_over_plain']:>12.2f}x "
              f"{r['cached_over_plain_paired_median']:>6.2f}x "
              f"{r['uncached_over_plain']:>14.2f}x")
    write_json("bench_instruction_cache", {"queries": args.queries, "repeats": args.repeats,
                                           "results": results})


if __name__ == "__main__":
    main()
