"""Shared-prefix reranking with prefix caching on vs off, in one process.

64 prompts = the same 400-token instruction + a distinct 40-token document, through a
~40M-parameter causal `*ForSequenceClassification` built from a seed. Prints prompts/s for
both, their ratio, and the ideal ratio (prompt tokens / tokens left to compute once the
shared full blocks are cached). Writes results/bench_prefix_cache.json.

    python benchmarks/bench_prefix_cache.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import pathlib
import random
import sys
import tempfile

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process, as a user's script gets)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import build_causal_classifier, interleave, median, write_json  # noqa: E402

from vllm import LLM  # noqa: E402

PREFIX, DOC, N = 400, 40, 64


def make_prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(1000, 30000) for _ in range(PREFIX)]
    return [prefix + [rng.randrange(1000, 30000) for _ in range(DOC)] for _ in range(N)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model-dir", default=None)
    args = ap.parse_args()
    tmp = None if args.model_dir else tempfile.TemporaryDirectory(prefix="bench_prefix_")
    model_dir = pathlib.Path(args.model_dir or tmp.name) / "causal_cls_40m"  # tmp: removed at exit
    build_causal_classifier(model_dir)
    prompts = make_prompts()
    llms = {"cache_on": LLM(str(model_dir), enable_prefix_caching=True),
            "cache_off": LLM(str(model_dir), enable_prefix_caching=False)}
    block = llms["cache_on"].llm_engine.vllm_config.cache_config.block_size
    inputs = [{"prompt_token_ids": p} for p in prompts]

    def run(name):
        def go():
            # A fresh prefix cache each run: only sharing within the batch counts.
            llms[name].reset_prefix_cache()
            return llms[name].classify(inputs, use_tqdm=False)
        return go

    for name in llms:   # warm-up, and an equality check between the two
        run(name)()
    a = [o.outputs.probs[0] for o in llms["cache_on"].classify(inputs, use_tqdm=False)]
    b = [o.outputs.probs[0] for o in llms["cache_off"].classify(inputs, use_tqdm=False)]
    max_diff = max(abs(x - y) for x, y in zip(a, b))
    times = interleave({n: run(n) for n in llms}, args.repeats)
    rate = {n: N / median(t) for n, t in times.items()}
    total = N * (PREFIX + DOC)
    shared = (PREFIX // block) * block
    ideal = total / (total - (N - 1) * shared)
    ratio = rate["cache_on"] / rate["cache_off"]
    print(f"{'setting':<10} {'prompts/s':>10}")
    for n in llms:
        print(f"{n:<10} {rate[n]:>10.1f}")
    print(f"speed-up {ratio:.2f}x, ideal {ideal:.2f}x, {100 * ratio / ideal:.0f}% of ideal; "
          f"max |prob diff| {max_diff:.2e}")
    write_json("bench_prefix_cache", {
        "prompts": N, "prefix_tokens": PREFIX, "doc_tokens": DOC, "block_size": block,
        "repeats": args.repeats, "seconds": times, "prompts_per_s": rate,
        "speedup": ratio, "ideal_speedup": ideal, "fraction_of_ideal": ratio / ideal,
        "max_abs_prob_diff": max_diff})


if __name__ == "__main__":
    main()
