"""Issue 27: prefix caching for STEP and MEAN pooling (causal models), cached vs uncached.

Two workloads through a ~40M-parameter random Qwen3 causal LM (build_causal_classifier,
MiniLM's BERT tokenizer), in one process, cached and uncached runs interleaved:

- **best-of-32 STEP scoring**: one 300-word problem, then 32 candidate solutions of 3-5
  steps (8-20 words each), every step ending in a step tag ([unused0]); served as a
  reward model with STEP pooling (`convert="reward"`, `step_tag_id` = the tag), prefix
  caching asked for (`enable_prefix_caching=True`) vs off;
- **MEAN embedding of instruction-prefixed queries**: 64 queries of 3-12 words after the
  same ~50-token `Instruct: ...\\nQuery: ` text, MEAN pooling, cached vs off.

The prefix cache is emptied before every cached run, so only sharing inside the batch
counts. Prints rates, the speed-up, the ideal speed-up (prompt tokens / tokens left to
compute once the shared full blocks are cached) and the largest difference between the
cached and uncached answers; writes results/bench_pooling_cache.json.

    python benchmarks/bench_pooling_cache.py [--repeats 5] [--quick]
"""
from __future__ import annotations

import argparse
import pathlib
import random
import sys
import tempfile

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process, as a user's script gets)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import (build_causal_classifier, cpu_model, interleave, make_texts,  # noqa: E402
                    median, write_json)

import torch  # noqa: E402

from vllm import LLM  # noqa: E402
from vllm.pooling_params import PoolingParams  # noqa: E402

TASK = ("Given a web search query written by a user, retrieve the relevant passages that "
        "answer the query, ranking documents by how well they answer it and preferring "
        "recent, reliable and complete sources over short or partial ones")
WORDS = ("cheap flights paris weather today python list sort best pizza near me how tall "
         "is everest river nile length vaccine side effects bitcoin price news").split()


def step_prompts(tokenizer, n: int, seed: int = 0) -> tuple[list[list[int]], int, int]:
    """(prompts, step tag id, problem tokens): one 300-word problem + n solutions."""
    tag = tokenizer.convert_tokens_to_ids("[unused0]")
    problem = tokenizer(make_texts(1, 300, 300, seed=seed)[0])["input_ids"][:-1]  # no [SEP]
    rng = random.Random(seed + 1)
    prompts = []
    for i in range(n):
        steps = make_texts(rng.randint(3, 5), 8, 20, seed=seed + 100 + i)
        ids = list(problem)
        for step in steps:
            ids += tokenizer(step, add_special_tokens=False)["input_ids"] + [tag]
        prompts.append(ids)
    return prompts, tag, len(problem)


def mean_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"Instruct: {TASK}\nQuery: " + " ".join(rng.choice(WORDS) for _ in
                                                    range(rng.randint(3, 12)))
            for _ in range(n)]


def ideal(lengths: list[int], shared: int, block: int) -> float:
    total = sum(lengths)
    return total / (total - (len(lengths) - 1) * (shared // block) * block)


def compare(llms: dict[str, LLM], run, repeats: int) -> dict:
    """Warm both, check they agree, then time them interleaved (cache emptied first)."""
    outs = {name: run(llm) for name, llm in llms.items()}
    assert all(a.numel() for a in outs["cached"]), "an empty answer"
    diff = max(float((a - b).abs().max()) for a, b in zip(outs["cached"], outs["uncached"]))

    def timed_run(name):
        def go():
            llms[name].reset_prefix_cache()
            run(llms[name])
        return go
    times = interleave({name: timed_run(name) for name in llms}, repeats)
    return {"seconds": times, "median_s": {n: median(t) for n, t in times.items()},
            "max_abs_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 repeats: a smoke run")
    ap.add_argument("--model-dir", default=None)
    args = ap.parse_args()
    repeats = 2 if args.quick else args.repeats
    tmp = None if args.model_dir else tempfile.TemporaryDirectory(prefix="bench_pool_")
    model_dir = pathlib.Path(args.model_dir or tmp.name) / "causal_lm_40m"
    build_causal_classifier(model_dir, head="ForCausalLM")
    results = {"repeats": repeats, "cpu_model": cpu_model()}

    # ----- best-of-32 STEP -------------------------------------------------------------
    step = {name: LLM(str(model_dir), convert="reward", enable_prefix_caching=on,
                      override_pooler_config={"pooling_type": "STEP"})
            for name, on in (("cached", True), ("uncached", False))}
    prompts, tag, problem = step_prompts(step["cached"].get_tokenizer(), 32)
    params = PoolingParams(step_tag_id=tag, softmax=False)
    inputs = [{"prompt_token_ids": p} for p in prompts]

    def score(llm):
        return [o.outputs.data for o in llm.encode(inputs, pooling_params=params,
                                                   pooling_task="encode", use_tqdm=False)]
    block = step["cached"].llm_engine.vllm_config.cache_config.block_size
    r = compare(step, score, repeats)
    r.update(candidates=len(prompts), problem_tokens=problem, block_size=block,
             tag_rows=sum(p.count(tag) for p in prompts),
             tokens=sum(map(len, prompts)), ideal_speedup=ideal(list(map(len, prompts)),
                                                                problem, block))
    r["speedup"] = r["median_s"]["uncached"] / r["median_s"]["cached"]
    results["step_best_of_32"] = r
    del step

    # ----- MEAN, instruction-prefixed queries -------------------------------------------
    mean = {name: LLM(str(model_dir), enable_prefix_caching=on,
                      override_pooler_config={"pooling_type": "MEAN"})
            for name, on in (("cached", True), ("uncached", False))}
    texts = mean_texts(64)
    tok = mean["cached"].get_tokenizer()
    lengths = [len(tok(t)["input_ids"]) for t in texts]
    shared = len(tok(f"Instruct: {TASK}\nQuery:")["input_ids"]) - 1

    def embed(llm):
        return [torch.tensor(o.outputs.embedding) for o in llm.embed(texts, use_tqdm=False)]
    m = compare(mean, embed, repeats)
    m.update(queries=len(texts), instruction_tokens=shared, tokens=sum(lengths),
             ideal_speedup=ideal(lengths, shared, block))
    m["speedup"] = m["median_s"]["uncached"] / m["median_s"]["cached"]
    results["mean_instruction_queries"] = m

    print(f"CPU: {results['cpu_model']}, {torch.get_num_threads()} threads, "
          f"{repeats} repeats (median)")
    print(f"{'workload':<28} {'cached/s':>9} {'uncached/s':>11} {'speed-up':>9} "
          f"{'ideal':>6} {'max|diff|':>10}")
    for name, res, n in (("STEP best-of-32 (prompts)", r, len(prompts)),
                         ("MEAN instructed (queries)", m, len(texts))):
        med = res["median_s"]
        print(f"{name:<28} {n / med['cached']:>9.1f} {n / med['uncached']:>11.1f} "
              f"{res['speedup']:>8.2f}x {res['ideal_speedup']:>5.2f}x "
              f"{res['max_abs_diff']:>10.2e}")
    write_json("bench_pooling_cache", results)


if __name__ == "__main__":
    main()
