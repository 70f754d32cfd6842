"""Attention alone: the engine's C++ packed-sequence kernel vs torch SDPA, float32.

The kernel is the one the install built for this CPU (AVX-512 or AVX2; printed).

Three shapes, 64 sequences each (fixed seed): MiniLM (12 heads of 32, bidirectional,
10-230 tokens), the 40M causal classifier (8 query / 4 key-value heads of 64, 16-512
tokens), a Qwen-like head_dim 128 (16 / 8 heads, causal, 16-512); plus the cache-reader
case of bench_prefix_cache (63 sequences of 40 new queries over a 400-token prefix read
through slots). q/k/v are strided views of one fused projection output, as in the models.
The baseline is what the engine does without the kernel: one SDPA call per sequence on
zero-copy slices. Interleaved repeats, medians; GFLOP/s counts 4·d per query-key pair
(half the pairs when causal). Also checks the two agree (max |diff|).

    python benchmarks/bench_attention.py [--repeats 7]

Writes results/bench_attention.json.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process, as a user's script gets)
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import interleave, median, write_json  # noqa: E402

NONE = torch.empty(0, dtype=torch.long)
SHAPES = {  # name: (query heads, kv heads, head_dim, causal, min len, max len)
    "minilm": (12, 12, 32, False, 10, 230),
    "classifier_40m": (8, 4, 64, True, 16, 512),
    "head_dim_128": (16, 8, 128, True, 16, 512),
}


def packed(hq: int, hkv: int, d: int, lengths: list[int], gen: torch.Generator,
           dtype: torch.dtype = torch.float32):
    """q, k, v [T, H, D]: strided views of one fused projection's output, as a model's."""
    t = sum(lengths)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen).to(dtype)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return tuple(x.view(t, -1, d) for x in (q, k, v))


def sdpa_loop(q, k, v, q_lens, k_lens, causal: bool, key_rows=None):
    """One SDPA call per sequence; queries are the last positions of their keys."""
    out, qs, ks = q.new_empty(q.shape), 0, 0
    for nq, nk in zip(q_lens, k_lens):
        rows = slice(ks, ks + nk) if key_rows is None else key_rows[ks: ks + nk]
        qq, kk, vv = (x.unsqueeze(0).transpose(1, 2)
                      for x in (q[qs: qs + nq], k[rows], v[rows]))
        mask = None
        if causal and nq != nk:
            mask = torch.arange(nk)[None, :] <= (nk - nq + torch.arange(nq))[:, None]
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask,
                                           is_causal=causal and mask is None,
                                           enable_gqa=q.shape[1] != k.shape[1])
        out[qs: qs + nq] = o[0].transpose(0, 1)
        qs, ks = qs + nq, ks + nk
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    from vllm._kernels.cpu_kernels import kernel_status, varlen_attention_kernel
    kernel = varlen_attention_kernel()
    if kernel is None:
        print(f"skip: the C++ kernel is {kernel_status('varlen_attention')}")
        write_json("bench_attention", {"skipped": kernel_status("varlen_attention")})
        return
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    cases = {}
    for name, (hq, hkv, d, causal, lo, hi) in SHAPES.items():
        lengths = [int(n) for n in rng.integers(lo, hi + 1, 64)]
        q, k, v = packed(hq, hkv, d, lengths, gen)
        off = torch.tensor(np.cumsum([0] + lengths))
        pairs = sum(n * (n + 1) / 2 if causal else n * n for n in lengths)
        cases[name] = (4 * d * hq * pairs,
                       lambda q=q, k=k, v=v, off=off, causal=causal, d=d: kernel(
                           q, k, v, off, off, NONE, NONE, d ** -0.5, causal),
                       lambda q=q, k=k, v=v, lengths=lengths, causal=causal: sdpa_loop(
                           q, k, v, lengths, lengths, causal))
    # bench_prefix_cache's readers: 40 queries each after a shared 400-token prefix
    hq, hkv, d = 8, 4, 64
    cache_k, cache_v = (torch.randn(4096, hkv, d, generator=gen) for _ in range(2))
    prefix = torch.randperm(4096, generator=gen)[:400]
    own = torch.randperm(4096, generator=gen)[400: 400 + 63 * 40].view(63, 40)
    rows = torch.cat([torch.cat([prefix, o]) for o in own])
    tiles, ids = {}, []
    for i in range(63):
        r = rows[i * 440: (i + 1) * 440].numpy()
        ids += [tiles.setdefault(r[t: t + 64].tobytes(), len(tiles)) for t in range(0, 440, 64)]
    q = torch.randn(63 * 40, hq, d, generator=gen)
    qo, ko = torch.arange(64) * 40, torch.arange(64) * 440
    cases["prefix_readers"] = (
        4 * d * hq * 63 * sum(400 + i + 1 for i in range(40)),
        lambda: kernel(q, cache_k, cache_v, qo, ko, rows, torch.tensor(ids), d ** -0.5, True),
        lambda: sdpa_loop(q, cache_k, cache_v, [40] * 63, [440] * 63, True, rows))

    from vllm._kernels.cpu_kernels import library
    isa = library().vllm_kernels_isa().decode()
    print(f"kernel built for {isa}; {torch.get_num_threads()} threads")
    results = {}
    print(f"{'case':<16} {'kernel ms':>10} {'SDPA ms':>9} {'kernel GFLOP/s':>15} "
          f"{'SDPA GFLOP/s':>13} {'speed-up':>9} {'max |diff|':>11}")
    for name, (flops, fast, base) in cases.items():
        diff = (fast() - base()).abs().max().item()
        times = interleave({"kernel": fast, "sdpa": base}, args.repeats)
        tk, ts = median(times["kernel"]), median(times["sdpa"])
        results[name] = {"kernel_ms": 1e3 * tk, "sdpa_ms": 1e3 * ts, "speedup": ts / tk,
                         "kernel_gflops": flops / tk / 1e9, "sdpa_gflops": flops / ts / 1e9,
                         "max_abs_diff": diff, "seconds": times}
        r = results[name]
        print(f"{name:<16} {r['kernel_ms']:>10.1f} {r['sdpa_ms']:>9.1f} "
              f"{r['kernel_gflops']:>15.0f} {r['sdpa_gflops']:>13.0f} {r['speedup']:>8.2f}x "
              f"{diff:>11.1e}")
    write_json("bench_attention", {"repeats": args.repeats, "isa": isa, "shapes": SHAPES,
                                   "results": results})


if __name__ == "__main__":
    main()
