"""Classification throughput: this engine vs Hugging Face transformers, causal ~40M model.

256 prompts of random token ids, log-uniform lengths 16-512 (many short, a few long; no
shared prefix; fixed seed) through a ~40M-parameter Qwen3ForSequenceClassification built
from a seed (common.build_causal_classifier, 1 label). This engine, `LLM(dir).classify`,
against `AutoModelForSequenceClassification` in float32 under `torch.inference_mode()` with
padded batches of 16: right padding with an attention mask, pad_token_id set, prompts
sorted by length (longest first, as sentence-transformers does) so each batch pads little —
the stronger baseline; `--baseline-order given` keeps the prompt order instead. The
engine runs with its defaults, its prefix cache emptied before every run.
Interleaved runs, medians. Prints prompts/s, tokens/s, the ratio, the largest |prob
difference| (the baseline's probability = sigmoid(logit)) and the model FLOP utilisation
of both (common.FLOP_FORMULA, causal). Writes results/bench_classify.json.

    python benchmarks/bench_classify.py [--quick] [--baseline-order sorted|given]
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process, as a user's script gets)
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_peak import measured_peak  # noqa: E402
from common import (FLOP_FORMULA, block_linear_params, build_causal_classifier,  # noqa: E402
                    count_params, empty_prefix_cache, interleave, make_token_prompts,
                    median, model_flops, warn_if_over_peak, write_json)


def hf_classify(model, prompts: list[list[int]], batch_size: int, pad_id: int,
                sort: bool) -> list[float]:
    """Probabilities (sigmoid of the single logit), in prompt order."""
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i])) if sort \
        else list(range(len(prompts)))
    probs = [0.0] * len(prompts)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            width = max(len(prompts[i]) for i in idx)
            ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for row, i in enumerate(idx):
                ids[row, :len(prompts[i])] = torch.tensor(prompts[i])
                mask[row, :len(prompts[i])] = 1
            logits = model(input_ids=ids, attention_mask=mask).logits
            for row, p in zip(idx, torch.sigmoid(logits[:, 0].float()).tolist()):
                probs[row] = p
    return probs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=16, help="the baseline's batch")
    ap.add_argument("--baseline-order", choices=["sorted", "given"], default="sorted")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-dir", default=None, help="where to build the model (temp dir)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 64 prompts, 3 repeats")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.repeats = min(args.prompts, 64), min(args.repeats, 3)

    from transformers import AutoModelForSequenceClassification
    from vllm import LLM

    tmp = None if args.model_dir else tempfile.TemporaryDirectory(prefix="bench_classify_")
    model_dir = pathlib.Path(args.model_dir or tmp.name) / "causal_cls_40m"  # tmp: removed at exit
    build_causal_classifier(model_dir)
    prompts = make_token_prompts(args.prompts, args.min_len, args.max_len, seed=args.seed)
    lengths = [len(p) for p in prompts]
    hf = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    hf.eval()
    cfg = hf.config
    assert cfg.pad_token_id is not None and all(cfg.pad_token_id not in p for p in prompts)
    attn_dim = cfg.num_attention_heads * getattr(cfg, "head_dim", cfg.hidden_size //
                                                 cfg.num_attention_heads)
    flops = model_flops(lengths, block_linear_params(hf.model.layers), cfg.num_hidden_layers,
                        attn_dim, causal=True)
    llm = LLM(str(model_dir))
    inputs = [{"prompt_token_ids": p} for p in prompts]

    engine, baseline = "vllm (float32)", f"transformers (float32, bs {args.batch_size})"
    sort = args.baseline_order == "sorted"
    def run_engine():
        empty_prefix_cache(llm)   # no reuse of the previous run's blocks
        return llm.classify(inputs, use_tqdm=False)

    runs = {engine: run_engine,
            baseline: lambda: hf_classify(hf, prompts, args.batch_size, cfg.pad_token_id,
                                          sort)}
    ours = [o.outputs.probs[0] for o in runs[engine]()]   # warm-up + equality check
    ref = runs[baseline]()
    max_diff = max(abs(a - b) for a, b in zip(ours, ref))

    times = interleave(runs, args.repeats)
    peak = measured_peak("float32")
    n_tok = sum(lengths)
    rows = {}
    for label, t in times.items():
        sec = median(t)
        rows[label] = {"prompts_per_s": len(prompts) / sec, "tokens_per_s": n_tok / sec,
                       "model_gflops": flops / sec / 1e9, "peak_gflops": peak,
                       "mfu": flops / sec / 1e9 / peak}
    ratio = rows[engine]["prompts_per_s"] / rows[baseline]["prompts_per_s"]
    print(f"{len(prompts)} prompts, {n_tok} tokens (lengths {min(lengths)}-{max(lengths)}, "
          f"mean {n_tok / len(prompts):.0f}), {count_params(hf) / 1e6:.1f}M params, "
          f"{flops / 1e12:.2f} model TFLOP per pass, baseline order: {args.baseline_order}, "
          f"{args.repeats} interleaved repeats")
    print(f"{'setting':<32} {'prompts/s':>9} {'tokens/s':>9} {'GFLOP/s':>8} {'MFU':>6}")
    for label, r in rows.items():
        print(f"{label:<32} {r['prompts_per_s']:>9.1f} {r['tokens_per_s']:>9.0f} "
              f"{r['model_gflops']:>8.1f} {100 * r['mfu']:>5.1f}%")
    print(f"ratio {ratio:.2f}x; max |prob diff| {max_diff:.2e}")
    warn_if_over_peak({k: r["mfu"] for k, r in rows.items()})
    name = "bench_classify" if sort else "bench_classify_given"
    write_json(name, {
        "prompts": len(prompts), "min_len": args.min_len, "max_len": args.max_len,
        "seed": args.seed, "tokens": n_tok, "params": count_params(hf),
        "batch_size": args.batch_size, "baseline_order": args.baseline_order,
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
        "dtype": "float32", "repeats": args.repeats, "quick": args.quick,
        "model_tflop_per_pass": flops / 1e12, "flop_formula": FLOP_FORMULA,
        "seconds": times, "results": rows, "engine": engine, "baseline": baseline,
        "ratio": ratio, "max_abs_prob_diff": max_diff})


if __name__ == "__main__":
    main()
