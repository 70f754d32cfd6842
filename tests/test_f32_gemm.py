"""The C++ float32 GEMM (csrc/f32_gemm.cpp, layers/f32_gemm.py): equal to float64 torch in
every epilogue over partial blocks, several passes over K and row panels; the same numbers
for a row whatever the batch and thread count; chosen by the CPU platform where asked; and
an engine bound to it matching sentence-transformers and transformers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vllm._kernels.cpu_kernels import f32_gemm_kernel, kernel_isa
from vllm.model_executor.layers import f32_gemm as fg

KERNEL = f32_gemm_kernel()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="the kernel library has no SIMD "
                                "build here (the C++ GEMM needs AVX2 or AVX-512)")


@pytest.fixture(scope="module")
def gemm() -> fg.CppGemm:
    return fg.CppGemm(KERNEL)


def _case(m: int, k: int, n: int, seed: int = 0, stride: int = 0):
    """x [m, k] as a view of rows `stride` floats apart (default k + 5, as q/k/v splits
    are), W [n, k], bias [n], other [m, n]."""
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(m, stride or k + 5, generator=g)
    x = wide[:, 2:k + 2] if not stride else wide[:, :k]
    return (x, torch.randn(n, k, generator=g) / k ** 0.5, torch.randn(n, generator=g),
            torch.randn(m, n, generator=g))


@pytest.mark.parametrize("m,k,n,stride", [(1, 64, 16, 0), (5, 1000, 37, 0), (97, 384, 100, 0),
                                          (300, 800, 1536 + 8, 0), (130, 1024, 48, 1024),
                                          (61, 1000, 40, 2048)])
def test_every_epilogue_equals_float64_torch(gemm, m, k, n, stride):
    """Partial last blocks (n % 16), K across passes (k > 384), row panels and tiles of
    1-6 rows, each epilogue, strided x views; rows a multiple of 1024 floats apart take the
    path that copies them first."""
    x, w, b, other = _case(m, k, n, stride=stride)
    packed = gemm.pack(w)
    ref = F.linear(x.double(), w.double(), b.double())
    want = {"none": ref, "gelu": F.gelu(ref), "silu": F.silu(ref), "relu": F.relu(ref),
            "gelu_tanh": F.gelu(ref, approximate="tanh")}
    for name, expected in want.items():
        got = gemm.linear(x, packed, b, None if name == "none" else name)
        torch.testing.assert_close(got.double(), expected, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(gemm.linear_add(x, other, packed, b).double(),
                               ref + other.double(), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(gemm.linear_mul(x, other, packed, None).double(),
                               (ref - b.double()) * other.double(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("m", [3, 250])
def test_layer_norm_in_the_pass(gemm, m):
    """linear_add_norm: LayerNorm of x @ W.T + b + residual, as torch's, with and without a
    norm bias (250 rows: whole-row tasks; 3: tasks that split the columns)."""
    x, w, b, other = _case(m, 384, 384, seed=1)
    g = torch.Generator().manual_seed(2)
    nw, nb = torch.randn(384, generator=g), torch.randn(384, generator=g)
    ref = F.linear(x.double(), w.double(), b.double()) + other.double()
    for bias in (nb, None):
        got = gemm.linear_add_norm(x, other, gemm.pack(w), b, (nw, bias, 1e-12))
        want = F.layer_norm(ref, (384,), nw.double(), None if bias is None else bias.double(),
                            1e-12)
        torch.testing.assert_close(got.double(), want, atol=5e-5, rtol=1e-5)


def test_a_row_is_the_same_in_any_batch_and_thread_count(gemm):
    """Each output is summed in one fixed order (K passes in turn, tile rows apart): a
    row's numbers do not depend on the rows beside it, where the tasks split, or how many
    threads ran them (oneDNN's may)."""
    x, w, b, other = _case(300, 1000, 200, seed=3)
    packed = gemm.pack(w)
    full = gemm.linear_add(x, other, packed, b)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for lo, hi in ((0, 300), (7, 8), (5, 101), (250, 300)):
                part = gemm.linear_add(x[lo:hi], other[lo:hi], packed, b)
                assert torch.equal(part, full[lo:hi]), (threads, lo, hi)
    finally:
        torch.set_num_threads(before)


def test_the_few_row_kernel_reads_its_packed_weights(gemm):
    """layers.skinny_gemm's kernel over this GEMM's packed copy (kp = K, nb = its block):
    every epilogue equal to torch at 1-64 rows, with a partial last block."""
    from vllm._kernels.cpu_kernels import skinny_gemm_kernel
    kernel = skinny_gemm_kernel(engine=False)
    assert kernel is not None, "every SIMD build (which this module needs) has both kernels"
    x, w, b, other = _case(64, 200, 37)
    skinny = fg.skinny_weight(kernel, gemm.pack(w), w)
    assert skinny is not None and (skinny.kp, skinny.nb) == (200, KERNEL.block)
    ref = F.linear(x.double(), w.double(), b.double())
    for rows in (1, 7, 64):
        for mode, want in ((None, ref), ("gelu", F.gelu(ref)), ("add", ref + other.double()),
                           ("mul", ref * other.double())):
            got = skinny(x[:rows], b, mode, other[:rows] if mode in ("add", "mul") else None)
            torch.testing.assert_close(got.double(), want[:rows], atol=2e-5, rtol=1e-5)


def test_weights_it_does_not_pack_run_on_torch(gemm):
    """bfloat16 (or any non-float32) weights stay plain and run torch's ops."""
    x, w, b, other = (t.bfloat16() for t in _case(9, 64, 32))
    assert gemm.pack(w) is None
    torch.testing.assert_close(gemm.linear(x, w, b, "gelu"), F.gelu(F.linear(x, w, b)))
    assert torch.equal(gemm.linear_add(x, other, w, b), F.linear(x, w, b) + other)


def test_the_kernel_refuses_a_weight_packed_for_another_block(gemm):
    w = torch.randn(32, 64)
    wrong = fg.PackedF32(fg.pack(w, 2 * KERNEL.block), 32)
    with pytest.raises(RuntimeError, match="not packed for this library"):
        gemm.linear(torch.randn(3, 64), wrong, None, None)


def test_platform_choice(monkeypatch):
    """auto: the C++ GEMM with an AVX2 build of the kernels (AVX2-only CPUs), oneDNN with an
    AVX-512 one; `cpp` and `onednn` force; bfloat16 never takes it; VLLM_CPU_ONEDNN_LINEAR=0
    is F.linear for all; an unknown choice is refused."""
    from vllm.model_executor.layers.linear import onednn_linear_ok
    from vllm.platforms import platform_for
    cpu = platform_for("cpu")
    other = "onednn" if onednn_linear_ok(torch.float32) else "torch"
    auto = "cpp" if kernel_isa() == "avx2" else other
    assert cpu.linear_impl(torch.float32) == auto
    monkeypatch.setenv("VLLM_CPU_F32_GEMM", "cpp")
    assert cpu.linear_impl(torch.float32) == "cpp"
    assert isinstance(cpu.linear_gemm(torch.float32), fg.CppGemm)
    assert cpu.linear_impl(torch.bfloat16) != "cpp"
    assert cpu.skinny_gemm(torch.float32).func is fg.skinny_weight  # few rows: on its weights
    monkeypatch.setenv("VLLM_CPU_F32_GEMM", "onednn")
    assert cpu.linear_impl(torch.float32) == other
    monkeypatch.setenv("VLLM_CPU_F32_GEMM", "cpp")
    monkeypatch.setenv("VLLM_CPU_ONEDNN_LINEAR", "0")
    assert cpu.linear_impl(torch.float32) == "torch"
    monkeypatch.setenv("VLLM_CPU_F32_GEMM", "mkl")
    monkeypatch.delenv("VLLM_CPU_ONEDNN_LINEAR")
    with pytest.raises(ValueError, match="VLLM_CPU_F32_GEMM='mkl': use one of auto, cpp"):
        cpu.linear_impl(torch.float32)


def _bound_gemms(llm) -> set[str]:
    """The GEMMs of the engine's projections, "+few" where few rows run the few-row kernel."""
    from vllm.model_executor.layers.linear import Linear
    model = llm.llm_engine.runner.model
    return {m.gemm.name + ("+few" if m.skinny is not None else "")
            for m in model.modules() if isinstance(m, Linear)}


def test_minilm_on_the_cpp_gemm_matches_sentence_transformers(monkeypatch, minilm_dir):
    """The real MiniLM (post-LN: its LayerNorms in the GEMM's pass) on the C++ GEMM."""
    from sentence_transformers import SentenceTransformer

    from vllm import LLM
    monkeypatch.setenv("VLLM_CPU_F32_GEMM", "cpp")
    texts = ["a short sentence", "the quick brown fox jumps over the lazy dog " * 20,
             "vLLM pools hidden states into one embedding per prompt"]
    llm = LLM(model=minilm_dir)
    assert _bound_gemms(llm) == {"cpp+few"}
    got = np.array([o.outputs.embedding for o in llm.embed(texts)])
    want = SentenceTransformer(minilm_dir, device="cpu").encode(texts)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.99999, cos


def test_gated_qwen3_classifier_on_the_cpp_gemm_matches_transformers(monkeypatch,
                                                                      qwen3_cls_dir):
    """A Qwen3 sequence classifier (SwiGLU MLP: SiLU and the multiply in the epilogues)."""
    import model_factory as mf

    from vllm import LLM
    monkeypatch.setenv("VLLM_CPU_F32_GEMM", "cpp")
    texts = ["what is the capital of France?", "Paris is the capital of France. " * 9]
    llm = LLM(model=qwen3_cls_dir)
    assert _bound_gemms(llm) == {"cpp+few"}
    tok = mf.hf_tokenizer(qwen3_cls_dir)
    for text, out in zip(texts, llm.classify(texts)):
        want = mf.probs_from_logits(mf.hf_seqcls_logits(qwen3_cls_dir,
                                                         tok(text)["input_ids"]))
        np.testing.assert_allclose(out.outputs.probs, want.numpy(), atol=1e-5)
