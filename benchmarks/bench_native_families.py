"""Native MPNet vs the Transformers backend vs sentence-transformers, float32, one process.

An all-mpnet-base-v2-shaped model at a small size (hidden 384, 6 layers, 12 heads,
intermediate 1536, 32 relative-position buckets) with random weights from a fixed seed,
saved with sentence-transformers files (MEAN pooling + Normalize, as all-mpnet-base-v2) and
MiniLM's tokenizer. The same directory three ways, interleaved, medians:
`LLM(dir).embed(texts)` (native MPNetModel), `LLM(dir, model_impl="transformers")` (the
Transformers backend: MPNet's attention cannot be routed, so each step runs as one padded
batch) and `SentenceTransformer(dir).encode(texts, batch_size=32)`, over mixed-length texts
(8-200 words, the bench_embed mix). Prints texts/s, the two ratios and the largest cosine
deviation from sentence-transformers.

    python benchmarks/bench_native_families.py [--texts 256] [--repeats 3] [--quick]

Writes results/bench_native_families.json. Other processes on the machine make the
figures noisy; compare ratios from one run.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Callable

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process, as a user's script gets)
import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import machine_info, make_texts, median, minilm_dir, write_json  # noqa: E402

MAX_SEQ = 384
ST = "sentence_transformers.models."


def build_mpnet(path: pathlib.Path, seed: int, layers: int, hidden: int) -> pathlib.Path:
    """A random MPNet with all-mpnet-base-v2's files: [Transformer, Pooling mean, Normalize]."""
    import transformers
    cfg = transformers.MPNetConfig(
        vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 32, intermediate_size=4 * hidden,
        max_position_embeddings=514, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    torch.manual_seed(seed)
    transformers.MPNetModel(cfg).save_pretrained(str(path))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        shutil.copy(minilm_dir() / name, path / name)
    tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
    tok_cfg.update(model_input_names=["input_ids", "attention_mask"], model_max_length=512)
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden, "pooling_mode_mean_tokens": True}))
    (path / "2_Normalize").mkdir()
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": ST + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": ST + "Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": ST + "Normalize"}]))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ}))
    return path


def interleave_wall_cpu(runs: dict[str, Callable[[], object]],
                       repeats: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each run `repeats` times, alternating; wall seconds and this process's CPU seconds
    (on a shared machine the CPU seconds move less with the other processes' load)."""
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            w, c = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - w)
            cpu[name].append(time.process_time() - c)
    return wall, cpu


def _cos_dev(ours: np.ndarray, ref: np.ndarray) -> float:
    cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    return float(1 - cos.min())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--batch-size", type=int, default=32, help="sentence-transformers' batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke run: 32 texts, 1 repeat")
    args = ap.parse_args()
    if args.quick:
        args.texts, args.repeats = min(args.texts, 32), 1

    from sentence_transformers import SentenceTransformer
    from vllm import LLM

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_mpnet(pathlib.Path(tmp) / "mpnet-random", args.seed, args.layers,
                                args.hidden)
        texts = make_texts(args.texts, 8, 200, seed=args.seed)
        st = SentenceTransformer(str(model_dir), device="cpu")
        lengths = [min(len(ids), MAX_SEQ) for ids in st.tokenizer(texts)["input_ids"]]
        native = LLM(str(model_dir), dtype="float32")
        backend = LLM(str(model_dir), dtype="float32", model_impl="transformers")
        assert native.llm_engine.vllm_config.model_config.impl == "vllm"
        assert backend.llm_engine.vllm_config.model_config.impl == "transformers"
        labels = ("vllm native MPNet", "vllm --model-impl transformers",
                  "sentence-transformers")
        runs = {labels[0]: lambda: native.embed(texts, use_tqdm=False),
                labels[1]: lambda: backend.embed(texts, use_tqdm=False),
                labels[2]: lambda: st.encode(texts, batch_size=args.batch_size)}
        ref = np.asarray(runs[labels[2]](), dtype=np.float64)   # warm-up + equality check
        devs = {}
        for label in labels[:2]:
            outs = np.array([o.outputs.embedding for o in runs[label]()], dtype=np.float64)
            devs[label] = _cos_dev(outs, ref)
        times, cpu = interleave_wall_cpu(runs, args.repeats)
    n_tok = sum(lengths)
    rows = {label: {"texts_per_s": len(texts) / median(t), "tokens_per_s": n_tok / median(t),
                    "median_s": median(t), "median_cpu_s": median(cpu[label])}
            for label, t in times.items()}
    vs_backend = rows[labels[0]]["texts_per_s"] / rows[labels[1]]["texts_per_s"]
    vs_st = rows[labels[0]]["texts_per_s"] / rows[labels[2]]["texts_per_s"]
    cpu_ratios = [rows[other]["median_cpu_s"] / rows[labels[0]]["median_cpu_s"]
                  for other in labels[1:]]
    print(f"MPNet {args.layers} layers, hidden {args.hidden}; {len(texts)} texts, {n_tok} "
          f"tokens (mean {n_tok / len(texts):.0f}, max {max(lengths)}), {args.repeats} "
          f"interleaved repeats, {torch.get_num_threads()} threads")
    print(f"{'setting':<34} {'texts/s':>8} {'tokens/s':>9} {'median s':>9} {'CPU s':>7}")
    for label, r in rows.items():
        print(f"{label:<34} {r['texts_per_s']:>8.2f} {r['tokens_per_s']:>9.0f} "
              f"{r['median_s']:>9.3f} {r['median_cpu_s']:>7.2f}")
    print(f"native / transformers backend {vs_backend:.2f}x; native / sentence-transformers "
          f"{vs_st:.2f}x; max cosine deviation vs sentence-transformers: native "
          f"{devs[labels[0]]:.1e}, backend {devs[labels[1]]:.1e}")
    print(f"by CPU seconds: native / transformers backend {cpu_ratios[0]:.2f}x; native / "
          f"sentence-transformers {cpu_ratios[1]:.2f}x")
    write_json("bench_native_families", {
        "model": {"family": "MPNet", "layers": args.layers, "hidden": args.hidden},
        "texts": len(texts), "words": [8, 200], "seed": args.seed, "tokens": n_tok,
        "max_tokens": max(lengths), "dtype": "float32", "batch_size": args.batch_size,
        "repeats": args.repeats, "quick": args.quick, "seconds": times, "results": rows,
        "cpu_seconds": cpu, "ratio_vs_transformers_backend": vs_backend,
        "ratio_vs_sentence_transformers": vs_st, "cpu_ratio_vs_transformers_backend":
        cpu_ratios[0], "cpu_ratio_vs_sentence_transformers": cpu_ratios[1],
        "max_cosine_deviation": devs})


if __name__ == "__main__":
    main()
