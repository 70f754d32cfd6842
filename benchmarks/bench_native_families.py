"""Native implementations vs the Transformers backend vs sentence-transformers, float32,
one process, for the encoder families issue 36 made native: MPNet (all-mpnet-base-v2),
NomicBERT (nomic-embed-text) and GTE (`GteModel`: snowflake-arctic-embed-m-v2.0).

Each family at a small size (hidden 384, 6 layers, intermediate 1536 unless changed) with
random weights from a fixed seed, written by transformers' own class, with
sentence-transformers files (MPNet / NomicBERT: MEAN + Normalize, GTE: CLS + Normalize, as
their hub models) and MiniLM's tokenizer. The same directory three ways, interleaved,
medians: `LLM(dir).embed(texts)` (native), `LLM(dir, model_impl="transformers")` (the
Transformers backend; MPNet's attention cannot be routed, so its steps run as padded
batches) and `SentenceTransformer(dir).encode(texts, batch_size=32)`, over mixed-length
texts (8-200 words, the bench_embed mix). Prints texts/s, the two ratios and the largest
cosine deviation from sentence-transformers, per family.

    python benchmarks/bench_native_families.py [--family mpnet|nomic|gte|all] [--texts 256]
        [--repeats 3] [--quick]

Writes results/bench_native_families.json (one entry per family). Other processes on the
machine make the figures noisy; compare ratios from one run (CPU seconds are printed too).
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


def _config(family: str, layers: int, hidden: int):
    """transformers' config of `family` at this size (MiniLM's 30522-token vocabulary)."""
    import transformers
    size = dict(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=hidden // 32, intermediate_size=4 * hidden)
    if family == "mpnet":
        return transformers.MPNetModel, transformers.MPNetConfig(
            **size, max_position_embeddings=514, pad_token_id=1, bos_token_id=0,
            eos_token_id=2)
    if family == "nomic":
        return transformers.NomicBertModel, transformers.NomicBertConfig(
            **size, max_position_embeddings=2048, pad_token_id=0)
    return transformers.GteModel, transformers.GteConfig(
        **size, max_position_embeddings=8192, pad_token_id=0)


# each family's pooling, as its hub models' sentence-transformers files say
POOLING = {"mpnet": "pooling_mode_mean_tokens", "nomic": "pooling_mode_mean_tokens",
           "gte": "pooling_mode_cls_token"}


def build(family: str, path: pathlib.Path, seed: int, layers: int,
          hidden: int) -> pathlib.Path:
    """A random `family` model with sentence-transformers files: [Transformer, Pooling,
    Normalize]."""
    cls, cfg = _config(family, layers, hidden)
    torch.manual_seed(seed)
    cls(cfg).save_pretrained(str(path))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        shutil.copy(minilm_dir() / name, path / name)
    tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
    tok_cfg.update(model_input_names=["input_ids", "attention_mask"], model_max_length=512)
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden, POOLING[family]: True}))
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


def measure(family: str, args: argparse.Namespace, texts: list[str]) -> dict:
    """One family's three settings, interleaved: rows, ratios, cosine deviations."""
    from sentence_transformers import SentenceTransformer
    from vllm import LLM

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build(family, pathlib.Path(tmp) / family, args.seed, args.layers,
                              args.hidden))
        st = SentenceTransformer(model_dir, device="cpu")
        lengths = [min(len(ids), MAX_SEQ) for ids in st.tokenizer(texts)["input_ids"]]
        native = LLM(model_dir, dtype="float32")
        backend = LLM(model_dir, dtype="float32", model_impl="transformers")
        assert native.llm_engine.vllm_config.model_config.impl == "vllm"
        assert backend.llm_engine.vllm_config.model_config.impl == "transformers"
        labels = ("vllm native", "vllm --model-impl transformers", "sentence-transformers")
        runs = {labels[0]: lambda: native.embed(texts, use_tqdm=False),
                labels[1]: lambda: backend.embed(texts, use_tqdm=False),
                labels[2]: lambda: st.encode(texts, batch_size=args.batch_size)}
        ref = np.asarray(runs[labels[2]](), dtype=np.float64)   # warm-up + equality check
        devs = {label: _cos_dev(np.array([o.outputs.embedding for o in runs[label]()],
                                         dtype=np.float64), ref) for label in labels[:2]}
        times, cpu = interleave_wall_cpu(runs, args.repeats)
    n_tok = sum(lengths)
    rows = {label: {"texts_per_s": len(texts) / median(t), "tokens_per_s": n_tok / median(t),
                    "median_s": median(t), "median_cpu_s": median(cpu[label])}
            for label, t in times.items()}
    native_rate = rows[labels[0]]["texts_per_s"]
    return {"family": family, "tokens": n_tok, "max_tokens": max(lengths), "results": rows,
            "seconds": times, "cpu_seconds": cpu, "max_cosine_deviation": devs,
            "ratio_vs_transformers_backend": native_rate / rows[labels[1]]["texts_per_s"],
            "ratio_vs_sentence_transformers": native_rate / rows[labels[2]]["texts_per_s"],
            "cpu_ratio_vs_transformers_backend":
                rows[labels[1]]["median_cpu_s"] / rows[labels[0]]["median_cpu_s"],
            "cpu_ratio_vs_sentence_transformers":
                rows[labels[2]]["median_cpu_s"] / rows[labels[0]]["median_cpu_s"]}


def report(r: dict, args: argparse.Namespace, n_texts: int) -> None:
    print(f"\n{r['family']}: {args.layers} layers, hidden {args.hidden}; {n_texts} texts, "
          f"{r['tokens']} tokens (max {r['max_tokens']}), {args.repeats} interleaved "
          f"repeats, {torch.get_num_threads()} threads")
    print(f"{'setting':<34} {'texts/s':>8} {'tokens/s':>9} {'median s':>9} {'CPU s':>7}")
    for label, row in r["results"].items():
        print(f"{label:<34} {row['texts_per_s']:>8.2f} {row['tokens_per_s']:>9.0f} "
              f"{row['median_s']:>9.3f} {row['median_cpu_s']:>7.2f}")
    dev = r["max_cosine_deviation"]
    print(f"native / transformers backend {r['ratio_vs_transformers_backend']:.2f}x "
          f"(CPU s {r['cpu_ratio_vs_transformers_backend']:.2f}x); native / "
          f"sentence-transformers {r['ratio_vs_sentence_transformers']:.2f}x (CPU s "
          f"{r['cpu_ratio_vs_sentence_transformers']:.2f}x); max cosine deviation vs "
          f"sentence-transformers: " + ", ".join(f"{k} {v:.1e}" for k, v in dev.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=(*POOLING, "all"), default="all")
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
    families = list(POOLING) if args.family == "all" else [args.family]
    texts = make_texts(args.texts, 8, 200, seed=args.seed)
    print(machine_info())
    results = []
    for family in families:
        results.append(measure(family, args, texts))
        report(results[-1], args, len(texts))
    write_json("bench_native_families", {
        "model": {"layers": args.layers, "hidden": args.hidden}, "texts": len(texts),
        "words": [8, 200], "seed": args.seed, "dtype": "float32",
        "batch_size": args.batch_size, "repeats": args.repeats, "quick": args.quick,
        "families": results})


if __name__ == "__main__":
    main()
