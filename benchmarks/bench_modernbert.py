"""ModernBERT embedding throughput: this engine vs sentence-transformers, float32.

A ModernBERT-base-shaped model (hidden 768, 22 layers, 12 heads, intermediate 1152, a
global layer every third, local window 128 = 64 tokens each side) with random weights from
a fixed seed, saved with sentence-transformers files (CLS pooling + Normalize, as
gte-modernbert) and MiniLM's tokenizer (vocabulary 30522 instead of 50368: only the
embedding table shrinks). 512 English-looking texts of 8-200 words (the bench_embed mix),
both in this process: `LLM(dir).embed(texts)` vs `SentenceTransformer(dir).encode(texts,
batch_size=32)`, interleaved, medians. Prints texts/s, tokens/s, the ratio and the largest
cosine deviation between the two outputs.

    python benchmarks/bench_modernbert.py [--texts 512] [--repeats 3] [--quick]

Writes results/bench_modernbert.json.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process, as a user's script gets)
import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_peak import measured_peak  # noqa: E402
from common import (block_linear_params, interleave, make_texts, machine_info,  # noqa: E402
                    median, minilm_dir, warn_if_over_peak, write_json)

MAX_SEQ = 512


def build_model(path: pathlib.Path, seed: int) -> pathlib.Path:
    """ModernBERT-base shape, random weights, ST files [Transformer, Pooling cls, Normalize]."""
    import json
    import shutil

    import transformers
    cfg = transformers.ModernBertConfig(
        vocab_size=30522, hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
        num_attention_heads=12, global_attn_every_n_layers=3, local_attention=128,
        max_position_embeddings=8192, pad_token_id=0, bos_token_id=101, cls_token_id=101,
        eos_token_id=102, sep_token_id=102)
    torch.manual_seed(seed)
    transformers.ModernBertModel(cfg).save_pretrained(str(path))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        shutil.copy(minilm_dir() / name, path / name)
    tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
    tok_cfg.update(model_input_names=["input_ids", "attention_mask"], model_max_length=MAX_SEQ)
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 768, "pooling_mode_cls_token": True}))
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}]))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ}))
    return path


def modernbert_flops(lengths: list[int], linear_params: int, layers: int, width: int,
                     every: int, window: int) -> float:
    """FLOPs of one pass (common.FLOP_FORMULA, bidirectional), with each local layer's
    attention counted over the query-key pairs its window (±window/2) lets in."""
    half = window // 2
    total = 0.0
    for n in lengths:
        local_pairs = sum(min(i + half, n - 1) - max(i - half, 0) + 1 for i in range(n))
        n_global = len(range(0, layers, every))
        pairs = n_global * n * n + (layers - n_global) * local_pairs
        total += 2 * linear_params * n + 4 * width * pairs
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32, help="sentence-transformers' batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke run: 64 texts, 2 repeats")
    args = ap.parse_args()
    if args.quick:
        args.texts, args.repeats = min(args.texts, 64), min(args.repeats, 2)

    from sentence_transformers import SentenceTransformer
    from vllm import LLM

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(pathlib.Path(tmp) / "modernbert-base-random", args.seed)
        texts = make_texts(args.texts, 8, 200, seed=args.seed)
        st = SentenceTransformer(str(model_dir), device="cpu")
        lengths = [len(ids) for ids in st.tokenizer(texts)["input_ids"]]
        llm = LLM(str(model_dir), dtype="float32")
        engine, baseline = "vllm (float32)", "sentence-transformers (float32)"
        runs = {engine: lambda: llm.embed(texts, use_tqdm=False),
                baseline: lambda: st.encode(texts, batch_size=args.batch_size)}
        ours = np.array([o.outputs.embedding for o in runs[engine]()], dtype=np.float64)
        ref = np.asarray(runs[baseline](), dtype=np.float64)   # warm-up + equality check
        times = interleave(runs, args.repeats)
        cfg = st[0].auto_model.config
        flops = modernbert_flops(lengths, block_linear_params(st[0].auto_model.layers),
                                 cfg.num_hidden_layers, cfg.hidden_size,
                                 cfg.global_attn_every_n_layers, cfg.local_attention)
    peak = measured_peak("float32")
    cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    n_tok = sum(lengths)
    rows = {label: {"texts_per_s": len(texts) / median(t), "tokens_per_s": n_tok / median(t),
                    "median_s": median(t), "model_gflops": flops / median(t) / 1e9,
                    "mfu": flops / median(t) / 1e9 / peak} for label, t in times.items()}
    ratio = rows[engine]["texts_per_s"] / rows[baseline]["texts_per_s"]
    over_window = sum(n > 65 for n in lengths)
    print(f"{len(texts)} texts, {n_tok} tokens (mean {n_tok / len(texts):.0f}, max "
          f"{max(lengths)}; {over_window} longer than the local window reaches), "
          f"{args.repeats} interleaved repeats")
    print(f"CPU: {machine_info()['processor']}, peak float32 {peak:.1f} GFLOP/s; "
          f"{flops / 1e12:.2f} TFLOP per pass")
    print(f"{'setting':<34} {'texts/s':>8} {'tokens/s':>9} {'GFLOP/s':>8} {'MFU':>6}")
    for label, r in rows.items():
        print(f"{label:<34} {r['texts_per_s']:>8.2f} {r['tokens_per_s']:>9.0f} "
              f"{r['model_gflops']:>8.1f} {100 * r['mfu']:>5.1f}%")
    print(f"ratio {ratio:.2f}x; max cosine deviation vs sentence-transformers "
          f"{1 - cos.min():.2e}")
    warn_if_over_peak({k: r["mfu"] for k, r in rows.items()})
    write_json("bench_modernbert", {"machine": machine_info(), "peak_gflops": peak,
        "flops_per_pass": flops,
        "texts": len(texts), "words": [8, 200], "seed": args.seed, "tokens": n_tok,
        "max_tokens": max(lengths), "over_window": over_window, "dtype": "float32",
        "batch_size": args.batch_size, "repeats": args.repeats, "quick": args.quick,
        "seconds": times, "results": rows, "engine": engine, "baseline": baseline,
        "ratio": ratio, "max_cosine_deviation": float(1 - cos.min())})


if __name__ == "__main__":
    main()
