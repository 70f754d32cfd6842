"""Weights packed at one OpenMP thread count are never read at another's layout.

On AVX2, oneDNN packs a [192, 64] weight in blocks of 64 columns at one thread and of 16 at
two; the few-row kernel once took the layout from a cache keyed by shape alone and read a
second engine's weights at the first one's block width (a cross-encoder's 0.7947 came back
as 0.6824). Each case here compares with transformers, in this process (this CPU's oneDNN),
in a fresh one with oneDNN capped to AVX2 (`ONEDNN_MAX_CPU_ISA`, as on an AVX2-only CPU),
and there with the kernel library's AVX2 build as well, so an AVX-512 machine runs the
AVX2 build's path too.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import model_factory as mf
import packed_threads_scenario as scenario
from vllm._kernels import cpu_kernels
from vllm.model_executor.layers import linear as lin
from vllm.model_executor.layers import skinny_gemm as sg

ROOT = pathlib.Path(__file__).resolve().parents[1]
X86 = {"avx2", "fma"} <= cpu_kernels.cpu_flags()


def _reference(model_dir: str, task: str) -> np.ndarray:
    """transformers on each input alone (float32): cross-encoder or classifier
    probabilities, or the bundled MiniLM's embeddings via sentence-transformers."""
    if task == "classify":
        tok = mf.hf_tokenizer(model_dir)
        return np.array([mf.probs_from_logits(mf.hf_seqcls_logits(
            model_dir, tok(t)["input_ids"])).numpy() for t in [scenario.QUERY] + scenario.DOCS])
    if task == "score":
        tok = mf.hf_tokenizer(model_dir)
        return np.array([mf.probs_from_logits(mf.hf_seqcls_logits(
            model_dir, (enc := tok(scenario.QUERY, d))["input_ids"], enc["token_type_ids"])
        ).item() for d in scenario.DOCS])
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(model_dir, device="cpu")
    return st.encode([scenario.QUERY] + scenario.DOCS, normalize_embeddings=True)


def _check(result: dict, want: np.ndarray, task: str) -> None:
    for got in result["built"] + result["rerun"]:
        got = np.array(got)
        if task != "embed":
            np.testing.assert_allclose(got, want, atol=1e-4)
        else:
            cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1)
            assert cos.min() >= 0.9999, cos


# hidden 64: [192, 64] and other shapes whose AVX2 layout follows the thread count
CASES = [("bert_cls_dir", "score"), ("qwen3_cls_dir", "classify")]


@pytest.mark.parametrize("fixture,task", CASES + [("minilm_dir", "embed")])
def test_engines_packed_at_other_thread_counts_equal_transformers(request, fixture, task):
    """Three engines in this process, built at 1, 2 and 1 threads, each run at its own
    count and then at the caller's: every output equals transformers'."""
    model_dir = request.getfixturevalue(fixture)
    before = torch.get_num_threads()
    result = scenario.run(model_dir, task)
    assert torch.get_num_threads() == before
    _check(result, _reference(model_dir, task), task)


def _avx2_build(tmp_path_factory) -> pathlib.Path:
    """The kernel library built for AVX2 (x86-64-v3) with the project's CMakeLists.txt."""
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        pytest.fail("building the AVX2 variant needs cmake and a C++ compiler")
    where = tmp_path_factory.mktemp("kernels-avx2")
    for cmd in (["cmake", "-S", str(ROOT), "-B", str(where), "-DCMAKE_BUILD_TYPE=Release",
                 "-DVLLM_CPU_ARCH=x86-64-v3"], ["cmake", "--build", str(where), "-j2"]):
        subprocess.run(cmd, check=True, capture_output=True)
    return where / cpu_kernels.LIB_NAME


@pytest.fixture(scope="module")
def avx2_library(tmp_path_factory) -> pathlib.Path:
    return _avx2_build(tmp_path_factory)


def _in_fresh_process(model_dir: str, task: str, **env: str) -> dict:
    run = subprocess.run([sys.executable, str(pathlib.Path(__file__).parent /
                                              "packed_threads_scenario.py"), model_dir, task],
                         env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not X86, reason="oneDNN's AVX2 cap and the AVX2 build need an x86 CPU "
                    "with AVX2 and FMA")
@pytest.mark.parametrize("build", ["installed", "avx2", "avx2 onednn"])
@pytest.mark.parametrize("fixture,task", CASES)
def test_onednn_capped_to_avx2(request, fixture, task, build):
    """As on an AVX2-only CPU (oneDNN capped, its layout then follows the thread count),
    with the installed kernel build and with the AVX2 build: equal to transformers. The
    AVX2 build binds float32 projections to its C++ GEMM (`VLLM_CPU_F32_GEMM=auto`), or
    with `onednn` to oneDNN, and in both really runs few rows on the few-row kernel over
    the packed weights (a fallback to the GEMM alone cannot pass)."""
    model_dir = request.getfixturevalue(fixture)
    env = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    if build.startswith("avx2"):
        env["VLLM_CPU_KERNELS_LIB"] = str(request.getfixturevalue("avx2_library"))
    if build == "avx2 onednn":
        env["VLLM_CPU_F32_GEMM"] = "onednn"
    result = _in_fresh_process(model_dir, task, **env)
    _check(result, _reference(model_dir, task), task)
    if build.startswith("avx2"):
        assert "(avx2," in result["kernel"], result["kernel"]
        assert result["gemms"] == ["cpp" if build == "avx2" else "onednn"], result
        assert min(result["skinny"]) > 0, result


def test_a_copy_packed_at_another_layout_is_not_read():
    """Where the layout the probe found is not the one a weight was packed at (another
    thread count, or any other condition), that weight keeps oneDNN: `holds` reads its
    own copy back."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(192, 64, generator=g)
    packed = lin.pack_weight(w)
    kp, nb = sg.packed_layout(192, 64)
    assert sg.holds(packed, w, kp, nb)
    other_nb = 16 if nb != 16 else 64
    assert not sg.holds(packed, w, kp, other_nb)      # same size, other block width
    assert not sg.holds(packed, w + 1e-3, kp, nb)      # another weight's copy

    class Kernel:
        tile_width = 8
    real = sg.packed_layout
    try:
        sg.packed_layout = lambda n, k: (kp, other_nb)  # a probe answer for other conditions
        assert sg.skinny_weight(Kernel(), packed, w) is None
    finally:
        sg.packed_layout = real
    assert sg.skinny_weight(Kernel(), packed, w) is not None


def test_the_probe_is_keyed_by_thread_count():
    """The probe answers for the calling thread's count: a change of count probes again."""
    before = torch.get_num_threads()
    sg._probe.cache_clear()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            sg.packed_layout(192, 64)
        assert sg._probe.cache_info().currsize == 2
    finally:
        torch.set_num_threads(before)
