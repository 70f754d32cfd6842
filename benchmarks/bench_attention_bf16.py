"""The bfloat16 attention kernel (csrc/varlen_attention_bf16.cpp, AVX512-BF16) against what
a bfloat16 model ran before it: q/k/v cast to float32, the float32 kernel, the output cast
back to bfloat16 (the cast passes included, as CPU_NATIVE paid them).

Shapes, 64 sequences each (fixed seed), q/k/v strided views of one fused bf16 projection:
MiniLM (12 heads of 32, bidirectional, 50-250 tokens), head_dim 64 (12 heads,
bidirectional, 50-250), the 40M causal classifier (8 / 4 heads of 64, causal, 16-512),
head_dim 128 (16 / 8 heads, causal, 16-512), plus 63 cache readers of 40 queries after a
shared 400-token prefix read through slots of a bf16 cache (8 / 4 heads of 64; before the
kernel these went to TORCH_SDPA, here the float32 kernel on a float32 copy of the cache
stands in). Three settings, interleaved, medians: `f32 + casts`, `bf16` (the default: Q*K^T
on vdpbf16ps, P*V in float32) and `bf16 P*V` (P rounded to bf16, P*V on vdpbf16ps too).
GFLOP/s counts 4·d per query-key pair (half the pairs when causal); MFU against
bench_peak's measured bfloat16 peak. Cosine: of each output to the float32 kernel's.

    python benchmarks/bench_attention_bf16.py [--repeats 9]

Writes results/bench_attention_bf16.json.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process, as a user's script gets)
import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_attention import packed  # noqa: E402
from bench_peak import measured_peak  # noqa: E402
from common import interleave, machine_info, median, write_json  # noqa: E402

NONE = torch.empty(0, dtype=torch.long)
SHAPES = {  # name: (query heads, kv heads, head_dim, causal, min len, max len)
    "minilm_d32": (12, 12, 32, False, 50, 250),
    "d64": (12, 12, 64, False, 50, 250),
    "classifier_d64": (8, 4, 64, True, 16, 512),
    "d128": (16, 8, 128, True, 16, 512),
}


def settings(f32, bf16, q, k, v, qo, ko, rows, ids, scale, causal):
    """The three settings' calls: bf16 [Tq, Hq, D] out."""
    def before():
        qq, kk, vv = (x.float() for x in (q, k, v))
        return f32(qq, kk, vv, qo, ko, rows, ids, scale, causal).bfloat16()
    return {"f32 + casts": before,
            "bf16": lambda: bf16(q, k, v, qo, ko, rows, ids, scale, causal),
            "bf16 P*V": lambda: bf16(q, k, v, qo, ko, rows, ids, scale, causal,
                                     torch.bfloat16, True)}


def cases(f32, bf16, gen, rng) -> dict:
    out = {}
    for name, (hq, hkv, d, causal, lo, hi) in SHAPES.items():
        lengths = [int(n) for n in rng.integers(lo, hi + 1, 64)]
        q, k, v = packed(hq, hkv, d, lengths, gen, torch.bfloat16)
        off = torch.tensor(np.cumsum([0] + lengths))
        pairs = sum(n * (n + 1) / 2 if causal else n * n for n in lengths)
        out[name] = (4 * d * hq * pairs,
                     settings(f32, bf16, q, k, v, off, off, NONE, NONE, d ** -0.5, causal))
    hq, hkv, d = 8, 4, 64
    cache_k, cache_v = (torch.randn(4096, hkv, d, generator=gen).bfloat16() for _ in range(2))
    prefix = torch.randperm(4096, generator=gen)[:400]
    own = torch.randperm(4096, generator=gen)[400: 400 + 63 * 40].view(63, 40)
    rows = torch.cat([torch.cat([prefix, o]) for o in own])
    tiles, ids = {}, []
    for i in range(63):
        r = rows[i * 440: (i + 1) * 440].numpy()
        ids += [tiles.setdefault(r[t: t + 64].tobytes(), len(tiles)) for t in range(0, 440, 64)]
    q = torch.randn(63 * 40, hq, d, generator=gen).bfloat16()
    qo, ko = torch.arange(64) * 40, torch.arange(64) * 440
    out["prefix_readers"] = (4 * d * hq * 63 * sum(400 + i + 1 for i in range(40)),
                             settings(f32, bf16, q, cache_k, cache_v, qo, ko, rows,
                                      torch.tensor(ids), d ** -0.5, True))
    return out


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(1), b.double().flatten(1)   # per query row, all heads
    return float(((a * b).sum(1) / a.norm(dim=1) / b.norm(dim=1)).min())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    from vllm._kernels.cpu_kernels import (kernel_status, varlen_attention_bf16_kernel,
                                           varlen_attention_kernel)
    f32, bf16 = varlen_attention_kernel(), varlen_attention_bf16_kernel()
    if f32 is None or bf16 is None:
        why = kernel_status("varlen_attention_bf16")
        print(f"skip: the bfloat16 kernel is {why}")
        write_json("bench_attention_bf16", {"skipped": why})
        return
    peak = measured_peak("bfloat16")
    print(f"CPU: {machine_info()['processor']}, {torch.get_num_threads()} threads, measured "
          f"peak bfloat16 {peak:.0f} GFLOP/s")
    print(f"{'case':<16} {'setting':<12} {'ms':>7} {'GFLOP/s':>8} {'MFU':>6} {'speed-up':>9} "
          f"{'min cos to f32':>15}")
    results = {}
    for name, (flops, runs) in cases(f32, bf16, torch.Generator().manual_seed(0),
                                     np.random.default_rng(0)).items():
        ref = runs["f32 + casts"]().float()
        times = interleave(runs, args.repeats)
        base = median(times["f32 + casts"])
        results[name] = {}
        for label, t in times.items():
            sec = median(t)
            r = results[name][label] = {
                "ms": 1e3 * sec, "gflops": flops / sec / 1e9, "mfu_bf16": flops / sec / 1e9 / peak,
                "speedup": base / sec, "min_row_cosine_to_f32": cosine(runs[label](), ref),
                "seconds": t}
            print(f"{name:<16} {label:<12} {r['ms']:>7.2f} {r['gflops']:>8.0f} "
                  f"{100 * r['mfu_bf16']:>5.1f}% {r['speedup']:>8.2f}x "
                  f"{r['min_row_cosine_to_f32']:>15.7f}")
    write_json("bench_attention_bf16", {"repeats": args.repeats, "peak_bf16_gflops": peak,
                                        "shapes": SHAPES, "results": results})


if __name__ == "__main__":
    main()
