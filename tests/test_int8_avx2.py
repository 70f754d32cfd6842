"""quantization="int8" on CPUs with AVX2 and no int8 dot products (csrc/int8_gemm_avx2.cpp):
the kernel's int32 sums exact against integer products on random shapes and at the
saturation edges of a u8 x s8 `vpmaddubsw` (which the int16 `vpmaddwd` kernel must not
have); its fused float end; its layers equal to the oneDNN (VNNI) path's; the path chosen by the CPU's features (`int8_linear.choose_path`), logged and reported; MiniLM within
cosine 0.99 of float32 and 1e-3 of the VNNI path. An AVX-512 machine runs the AVX2 path
twice: in this process (the installed build's copy of the kernel, forced by
VLLM_CPU_INT8_PATH=avx2), and in a fresh process as on an AVX2-only CPU: the kernel
library's x86-64-v3 build, oneDNN capped to AVX2 (its int8 GEMM then saturates, so the
automatic choice must fall to the AVX2 kernel). That process is this file run as a script.
"""
from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vllm._kernels import cpu_kernels
from vllm.model_executor.layers import int8_linear as i8

ROOT = pathlib.Path(__file__).resolve().parents[1]
AVX2 = {"avx2", "fma"} <= cpu_kernels.cpu_flags()
pytestmark = pytest.mark.skipif(not AVX2, reason="the AVX2 int8 kernel needs an x86 CPU "
                                "with AVX2")
TEXTS = ["A man is playing a guitar on the stage.", "The cat sleeps.", "short",
         "Quantum computers use qubits that can be in superpositions of states, unlike "
         "classical bits, which makes some algorithms exponentially faster.",
         "What is the capital of France?", "Paris is the capital and largest city of France."]
TEXTS = TEXTS + [t.upper() for t in TEXTS]
# (rows, k, n): rows 1..64 and past a 64-row panel, k not a multiple of 32 (nor of 4)
SHAPES = [(1, 384, 384), (3, 37, 21), (4, 32, 16), (5, 3, 17), (17, 100, 1000),
          (64, 1536, 40), (70, 65, 33), (31, 255, 129)]


def _sums(kernel: Callable, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The kernel's int32 sums a @ w.T, through its dequantizing end at unit scales (exact
    in float32 below 2^24: every case here stays below)."""
    m, n = a.shape[0], w.shape[0]
    packed = i8.pack_avx2(w.contiguous(), kernel.block, group=kernel.group)
    return kernel(a, packed, n, torch.ones(m), torch.ones(n), None, 0)


def _gemm_errors(kernel: Callable) -> list[str]:
    """The AVX2 kernel against exact integer products: random operands (rows strided as
    models pass them) and the edges where `vpmaddubsw` on a + 128 would saturate (exact
    here: the kernel's pairs are int16 products in int32)."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for m, k, n in SHAPES:
        a = torch.randint(-127, 128, (m, k + 5), generator=g, dtype=torch.int8)[:, 2:k + 2]
        cases.append((f"random {m}x{k}x{n}", a,
                      torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)))
    for av, wv in ((127, 127), (127, -127), (-127, 127), (-127, -127), (-128, 127)):
        cases.append((f"all {av} x all {wv}", torch.full((9, 200), av, dtype=torch.int8),
                      torch.full((24, 200), wv, dtype=torch.int8)))
    alternating = torch.tensor([127, -127] * 48, dtype=torch.int8)
    cases.append(("alternating signs", alternating.repeat(6, 1), alternating.repeat(20, 1)))
    # all-255 activations in u8 (a + 128 = 255): a = 127 against +-127 in every pair
    cases.append(("u8 255 x +-127", torch.full((64, 64), 127, dtype=torch.int8),
                  torch.tensor([127, -127], dtype=torch.int8).repeat(16, 32)))
    errors = []
    for name, a, w in cases:
        want = a.long() @ w.long().t()
        assert want.abs().max() < 2 ** 24
        if not torch.equal(_sums(kernel, a, w), want.float()):
            errors.append(name)
    return errors


def _cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _gemm_paths(llm) -> set[str]:
    """The int8 paths the engine's projections run on (`Int8Gemm.path`)."""
    model = llm.llm_engine.runner.model
    return {m.gemm.path for m in model.modules() if getattr(m, "gemm", None) is not None
            and getattr(m.gemm, "name", None) == "int8"}


@pytest.fixture(scope="module")
def avx2_gemm() -> Callable:
    kernel = cpu_kernels.int8_gemm_avx2_kernel()
    assert kernel is not None, cpu_kernels.kernel_status("int8_gemm_avx2")
    return kernel


def test_kernel_exact_on_random_shapes_and_saturation_edges(avx2_gemm):
    assert _gemm_errors(avx2_gemm) == []
    # what the kernel avoids: pairs of u8 (a + 128) x s8 products added in int16 saturate
    a, w = torch.full((2, 64), 127, dtype=torch.int8), torch.full((3, 64), 127, dtype=torch.int8)
    pair = (127 + 128) * 127 * 2
    assert pair > 32767 and torch.equal(_sums(avx2_gemm, a, w),
                                        torch.full((2, 3), 64.0 * 127 * 127))


def test_kernel_refuses_a_wrong_layout(avx2_gemm):
    q = torch.zeros(2, 40, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="packed must be"):
        avx2_gemm(q, torch.zeros(1, 9, 16, 4, dtype=torch.int8), 16, torch.ones(2),
                  torch.ones(16), None, 0)
    # the VNNI / AMX kernels' layout (4 k per group) is not this kernel's (pairs of k)
    assert avx2_gemm.group == 2
    with pytest.raises(RuntimeError, match=r"packed must be contiguous int8 \(1, 20, 16, 2\)"):
        avx2_gemm(q, i8.pack_avx2(torch.ones(16, 40, dtype=torch.int8)), 16, torch.ones(2),
                  torch.ones(16), None, 0)


def test_layers_equal_the_onednn_path(avx2_gemm):
    """Same quantization, exact int32 sums: every entry point gives the oneDNN path's
    floats (bit for bit where torch._int_mm is exact; else the float64 reference's)."""
    kernels = cpu_kernels.int8_kernels()
    avx2, onednn = i8.Avx2Int8Gemm(kernels, avx2_gemm), i8.Int8Gemm(kernels)
    exact_int_mm = i8.int8_gemm_exact()
    g = torch.Generator().manual_seed(1)
    for rows in (1, 9, 70):
        x = torch.randn(rows, 100, generator=g)
        w, b = torch.randn(75, 100, generator=g) / 10, torch.randn(75, generator=g)
        other = torch.randn(rows, 75, generator=g)
        pa, po = avx2.pack(w), onednn.pack(w)
        calls = {"plain": lambda gm, p: gm.linear(x, p, b, None),
                 "gelu": lambda gm, p: gm.linear(x, p, b, "gelu"),
                 "silu": lambda gm, p: gm.linear(x, p, b, "silu"),
                 "add": lambda gm, p: gm.linear_add(x, other, p, b),
                 "mul": lambda gm, p: gm.linear_mul(x, other, p, b)}
        for name, call in calls.items():
            got = call(avx2, pa)
            if exact_int_mm:
                assert torch.equal(got, call(onednn, po)), name
            q, s = onednn.quantize(x)
            wq = po.q.double() * po.scale.double()[:, None]
            ref = (q.double() * s.double()[:, None]) @ wq.t() + b.double()
            want = {"plain": ref, "gelu": F.gelu(ref), "silu": F.silu(ref),
                    "add": ref + other.double(),
                    "mul": ref * other.double()}[name]
            torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
        if exact_int_mm:  # (gate, up) packed for each path
            assert torch.equal(avx2.gated(x, (avx2.pack(w[:36]), avx2.pack(w[36:72]))),
                               onednn.gated(x, (onednn.pack(w[:36]), onednn.pack(w[36:72]))))
    assert avx2.linear(torch.empty(0, 100), pa, b, None).shape == (0, 75)


def test_kernel_fused_float_end(avx2_gemm):
    """The float end the VNNI and AMX kernels share (int8_gemm_common.h `run_tasks`), on the
    AVX2 kernel: `quantized` rows are `quantize_rows` of its floats (`floats=False`: the
    same bytes, no floats), `norm` is the separate C++ LayerNorm of them, `out_dtype=bf16`
    their `.bfloat16()` (builds with AVX512-BF16), in whole-row tasks (400 rows) and tasks
    that split the columns (few rows), with and without a residual."""
    quantize, _ = cpu_kernels.int8_kernels()
    layer_norm = cpu_kernels.int8_layer_norm_kernel()
    g = torch.Generator().manual_seed(5)
    for m, k, n, mode in [(400, 100, 384, 1), (5, 64, 1000, 6), (1, 37, 21, 0)]:
        a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
        w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        args = (a, i8.pack_avx2(w, avx2_gemm.block, group=avx2_gemm.group), n,
                torch.rand(m, generator=g) / 100, torch.rand(n, generator=g) / 100,
                torch.randn(n, generator=g), mode,
                torch.randn(m, n, generator=g) if mode == 1 else None)
        plain = avx2_gemm(*args)
        out, q, s = avx2_gemm(*args, quantized=True)
        assert torch.equal(out, plain) and all(map(torch.equal, (q, s), quantize(plain)))
        stand_in, q2, s2 = avx2_gemm(*args, quantized=True, floats=False)
        assert torch.equal(q2, q) and torch.equal(s2, s) and not stand_in.any()
        nw, nb = torch.randn(n, generator=g), torch.randn(n, generator=g)
        assert torch.equal(avx2_gemm(*args, norm=(nw, nb, 1e-5)),
                           layer_norm(plain, nw, nb, 1e-5)), (m, k, n)
        if cpu_kernels.BF16_FLAGS <= cpu_kernels.cpu_flags() and \
                cpu_kernels.kernel_isa() == "avx512":
            assert torch.equal(avx2_gemm(*args, out_dtype=torch.bfloat16), plain.bfloat16())


def test_mlp_hands_its_hidden_rows_over_on_the_avx2_path(avx2_gemm):
    """`mlp_add` on the AVX2 path: the up GEMM quantizes its hidden rows in its pass (no
    float hidden rows written), the down GEMM reads them: the floats of the separate calls."""
    from vllm.model_executor.layers.linear import GatedLinear, Linear, mlp_add
    gemm = i8.Avx2Int8Gemm(cpu_kernels.int8_kernels(), avx2_gemm)
    assert gemm.fused_norm
    torch.manual_seed(3)
    for up in (Linear(64, 200, activation="gelu"), GatedLinear(64, 200)):
        down = Linear(200, 64)
        for layer in (up, down):
            layer.bind(gemm)
        x, residual = torch.randn(70, 64), torch.randn(70, 64)
        assert torch.equal(mlp_add(up, down, x, residual), down.forward_add(up(x), residual))
        hidden, quantized = up.forward_hidden(x)
        assert quantized is not None and hidden.stride() == (0, 1) and not hidden.any()


@pytest.mark.parametrize("flags,forced,exact,avx2_ok,want", [
    ({"avx2", "avx512_vnni"}, "auto", True, True, "VNNI"),
    ({"avx2", "avx_vnni"}, "auto", True, True, "VNNI"),
    ({"avx2", "avx512_vnni", "amx_int8"}, "auto", True, True, "AMX"),
    ({"avx2", "fma"}, "auto", True, True, "AVX2"),                 # Zen 2 / 3: no VNNI
    ({"avx2", "avx512_vnni"}, "auto", False, True, "AVX2"),        # oneDNN capped: saturates
    ({"avx2", "avx512_vnni"}, "avx2", True, True, "AVX2"),         # forced
    ({"avx2", "avx512_vnni"}, "onednn", True, True, "VNNI"),
])
def test_path_chosen_by_cpu_features(flags, forced, exact, avx2_ok, want):
    path, why = i8.choose_path(flags, forced, lambda: exact,
                               lambda: None if avx2_ok else "missing")
    assert path == want and why


@pytest.mark.parametrize("flags,forced,exact,match", [
    ({"sse4_2"}, "auto", True, "AVX512-VNNI, AVX-VNNI, AMX-INT8.*or AVX2.*AVX2 kernel is "
     "missing"),
    ({"avx2", "fma"}, "onednn", True, "onednn.*this CPU has none of them"),
    ({"avx2", "avx512_vnni"}, "onednn", False, "onednn.*not exact.*ONEDNN_MAX_CPU_ISA"),
    ({"avx2"}, "fastest", True, "VLLM_CPU_INT8_PATH='fastest'"),
])
def test_path_refused_where_none_can_run(flags, forced, exact, match):
    with pytest.raises(ValueError, match=match):
        i8.choose_path(flags, forced, lambda: exact,
                       lambda: None if "avx2" in flags else "missing")


@pytest.fixture(scope="module")
def minilm_embeddings(minilm_dir, shared_llm) -> dict[str, np.ndarray]:
    """This process's float32 MiniLM embeddings and, where oneDNN's int8 GEMM is exact
    here (a VNNI / AMX CPU), the VNNI path's, with float32 attention as an AVX2-only CPU
    runs it (VLLM_CPU_INT8_BF16_ATTENTION=0: any change of an activation redraws the int8
    rounding, so only the GEMM path may differ between the runs compared)."""
    from vllm import LLM
    embed = lambda llm: np.array([o.outputs.embedding for o in llm.embed(TEXTS)])  # noqa
    out = {"float32": embed(shared_llm(minilm_dir))}
    if cpu_kernels.cpu_flags() & set(i8.DOT_FLAGS) and i8.int8_gemm_exact():
        with pytest.MonkeyPatch.context() as env:
            env.setenv("VLLM_CPU_INT8_BF16_ATTENTION", "0")
            llm = LLM(minilm_dir, quantization="int8")
        assert _gemm_paths(llm) <= {"VNNI", "VNNI_FUSED", "AMX", "AMX_FUSED"}
        out["vnni"] = embed(llm)
    return out


def _check_minilm(int8: np.ndarray, ref: dict[str, np.ndarray]) -> None:
    cos = _cosines(ref["float32"], int8)
    assert cos.min() >= 0.99, cos.min()
    assert cos.min() < 0.99999  # it did run in int8
    if "vnni" in ref:  # the same int32 sums: the same embeddings to float rounding
        np.testing.assert_allclose(int8, ref["vnni"], atol=1e-3)
        assert abs(_cosines(ref["float32"], ref["vnni"]).min() - cos.min()) < 1e-3


def test_minilm_forced_avx2_path_in_this_process(minilm_dir, minilm_embeddings, vllm_log,
                                                  monkeypatch):
    from vllm import LLM
    monkeypatch.setenv("VLLM_CPU_INT8_PATH", "avx2")
    monkeypatch.setenv("VLLM_CPU_INT8_BF16_ATTENTION", "0")  # as the reference's
    llm = LLM(minilm_dir, quantization="int8")
    assert "int8 projections: AVX2 path (C++ int16 vpmaddwd kernel" in vllm_log.text
    assert "forced by VLLM_CPU_INT8_PATH=avx2" in vllm_log.text
    assert _gemm_paths(llm) == {"AVX2"}
    _check_minilm(np.array([o.outputs.embedding for o in llm.embed(TEXTS)]),
                  minilm_embeddings)


def _avx2_build(where: pathlib.Path) -> pathlib.Path:
    """The kernel library built for AVX2 (x86-64-v3) with the project's CMakeLists.txt."""
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        pytest.fail("building the AVX2 variant needs cmake and a C++ compiler")
    for cmd in (["cmake", "-S", str(ROOT), "-B", str(where), "-DCMAKE_BUILD_TYPE=Release",
                 "-DVLLM_CPU_ARCH=x86-64-v3"], ["cmake", "--build", str(where), "-j2"]):
        subprocess.run(cmd, check=True, capture_output=True)
    return where / cpu_kernels.LIB_NAME


def test_minilm_on_the_avx2_build_as_on_an_avx2_only_cpu(minilm_dir, minilm_embeddings,
                                                         tmp_path):
    """A fresh process with the x86-64-v3 build and oneDNN capped to AVX2: the automatic
    choice (no VLLM_CPU_INT8_PATH) is the AVX2 path, logged; the kernel exact; MiniLM
    within cosine 0.99 of float32 and equal to the VNNI path's within 1e-3."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2",
           "VLLM_CPU_KERNELS_LIB": str(_avx2_build(tmp_path / "kernels-avx2"))}
    env.pop("VLLM_CPU_INT8_PATH", None)
    run = subprocess.run([sys.executable, __file__, minilm_dir], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert "(avx2," in result["kernel"], result["kernel"]
    assert result["gemm_errors"] == []
    assert result["paths"] == ["AVX2"]
    assert "int8 projections: AVX2 path" in result["log"], result["log"]
    # with int8 dot products on the CPU (capped) oneDNN is refused for saturating; on an
    # AVX2-only CPU, or under benchmarks/avx2_only.py's mask, there are none to refuse
    capped = bool(cpu_kernels.cpu_flags() & set(i8.DOT_FLAGS))
    assert ("oneDNN's int8 GEMM saturates in this process" if capped else
            "no int8 dot products on this CPU") in result["log"], result["log"]
    _check_minilm(np.array(result["int8"]), minilm_embeddings)
    # post-LN blocks' LayerNorm and the float32 attention: the AVX2 build's floats are this
    # build's, bit for bit
    assert torch.equal(torch.tensor(result["layer_norm"]), _layer_norm_sample())
    assert torch.equal(torch.tensor(result["attention"]), _attention_sample())


def _child(model_dir: str) -> dict:
    """Run in the fresh process: the kernel's exactness, MiniLM int8 (the automatic path),
    the int8 log line and the paths the engine reports."""
    from vllm import LLM
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("vllm").addHandler(handler)
    kernel = cpu_kernels.int8_gemm_avx2_kernel()
    errors = _gemm_errors(kernel) if kernel is not None else ["no AVX2 kernel"]
    int8 = LLM(model_dir, quantization="int8")
    embed = lambda llm: [o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)]  # noqa
    return {"kernel": cpu_kernels.kernel_status("int8_gemm_avx2"), "gemm_errors": errors,
            "paths": sorted(_gemm_paths(int8)), "int8": embed(int8),
            "layer_norm": _layer_norm_sample().tolist(),
            "attention": _attention_sample().tolist(),
            "log": "\n".join(r for r in records if "int8 projections" in r)}


def _layer_norm_sample() -> torch.Tensor:
    """The int8 paths' C++ LayerNorm on fixed rows (384 and 61 wide: with a tail)."""
    g = torch.Generator().manual_seed(5)
    norm = cpu_kernels.int8_layer_norm_kernel()
    rows = []
    for n in (384, 61):
        x, w, b = torch.randn(7, n, generator=g) * 3, torch.randn(n, generator=g), \
            torch.randn(n, generator=g)
        rows.append(norm(x, w, b, 1e-12).flatten())
    return torch.cat(rows)


def _attention_sample() -> torch.Tensor:
    """The float32 attention kernel on fixed ragged sequences (last key blocks of several
    lengths), bidirectional and causal, grouped heads, head_dim 32 and 64 (where the AVX2
    build copies V into tiles)."""
    g = torch.Generator().manual_seed(6)
    kernel, none = cpu_kernels.varlen_attention_kernel(), torch.empty(0, dtype=torch.long)
    lengths = [1, 7, 17, 50, 64, 65, 130]
    off = torch.tensor(np.cumsum([0] + lengths))
    outs = []
    for d in (32, 64):
        q = torch.randn(sum(lengths), 4, d, generator=g)
        k, v = (torch.randn(sum(lengths), 2, d, generator=g) for _ in range(2))
        for causal in (False, True):
            outs.append(kernel(q, k, v, off, off, none, none, d ** -0.5, causal).flatten())
    return torch.cat(outs)


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1])))
