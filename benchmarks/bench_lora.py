"""LoRA cost: one batch mixing 4 adapters and the base model against the base model alone,
on the same token ids (issue 26 A7; goal: at most 1.3x the base's time at rank 8).

Two models: the bundled all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384) and a seeded
Qwen3-Embedding-like causal LM (hidden 512, 8 layers; prefix caching off, so every run
computes every token). Each gets 4 PEFT adapters (rank 8, seeded A and B) on every
attention and MLP projection. The same engine runs both workloads, interleaved
(`--repeats`, median): base alone (every `lora_request` None) and the mix (base and
adapters A-D in turn, 1/5 of the prompts each). Writes results/bench_lora.json
(results/bench_lora_threads1.json with --threads 1).

    python benchmarks/bench_lora.py [--prompts 64] [--repeats 5] [--rank 8] [--threads N]
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process)
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import (build_causal_classifier, interleave, make_texts, median,  # noqa: E402
                    minilm_dir, write_json)

TARGETS = {
    "minilm": ["query", "key", "value", "attention.output.dense", "intermediate.dense",
               "output.dense"],
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def make_adapters(base: pathlib.Path, family: str, out: pathlib.Path, rank: int,
                  count: int = 4) -> list:
    """`count` seeded PEFT adapters of `rank` on every projection of `base`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    from vllm.lora.request import LoRARequest
    adapters = []
    for i in range(count):
        model = AutoModel.from_pretrained(str(base), dtype=torch.float32)
        peft = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank,
                                                target_modules=TARGETS[family]))
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        peft.save_pretrained(str(out / f"{family}-{i}"))
        adapters.append(LoRARequest(f"{family}-{i}", i + 1, str(out / f"{family}-{i}")))
    return adapters


def measure(model: pathlib.Path, adapters: list, texts: list[str], repeats: int,
            rank: int, **engine_kwargs) -> dict:
    from vllm import LLM
    llm = LLM(str(model), enable_lora=True, max_loras=len(adapters), max_lora_rank=rank,
              **engine_kwargs)
    tokens = [{"prompt_token_ids": ids} for ids in
              (llm.get_tokenizer()(t, truncation=True, max_length=256)["input_ids"]
               for t in texts)]
    cycle = [None] + adapters
    mixed = [cycle[i % len(cycle)] for i in range(len(tokens))]
    runs = {"base": lambda: llm.embed(tokens, use_tqdm=False),
            "mixed": lambda: llm.embed(tokens, lora_request=mixed, use_tqdm=False)}
    interleave(runs, 1)  # warm-up: loads the adapters, builds oneDNN primitives
    times = interleave(runs, repeats)
    base, mix = median(times["base"]), median(times["mixed"])
    return {"prompts": len(tokens), "tokens": sum(len(t["prompt_token_ids"]) for t in tokens),
            "adapters": len(adapters), "rank": rank, "base_s": base, "mixed_s": mix,
            "ratio": mix / base, "times": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default torch's; 1 is steadier on a busy host)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    texts = make_texts(args.prompts, 40, 120, seed=3)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        qwen3 = build_causal_classifier(root / "qwen3", head="ForCausalLM")
        models = {"minilm": (minilm_dir(), {}),
                  "qwen3": (qwen3, {"enable_prefix_caching": False})}
        for family, (path, kwargs) in models.items():
            adapters = make_adapters(path, family, root, args.rank)
            results[family] = r = measure(path, adapters, texts, args.repeats, args.rank,
                                          **kwargs)
            print(f"{family:7s} {r['prompts']} prompts, {r['tokens']} tokens: base "
                  f"{r['base_s'] * 1e3:.1f} ms, base + 4 adapters mixed "
                  f"{r['mixed_s'] * 1e3:.1f} ms -> {r['ratio']:.2f}x (goal <= 1.3x)")
    name = f"bench_lora_threads{args.threads}" if args.threads else "bench_lora"
    write_json(name, {"goal_ratio": 1.3, "threads": torch.get_num_threads(),
                              "results": results})


if __name__ == "__main__":
    main()
