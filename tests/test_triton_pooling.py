"""The pooler's reductions on TRITON_ATTN's kernel (vllm/attention/ops/triton_pooling.py):
the kernel against a float64 reference over ragged runs, the pooler's device path equal to
its torch path, and whole tiny models whose pooling ran the kernel.

Kernels run compiled on a GPU and in Triton's interpreter on the CPU
(tests/triton_interpret.py); the launch counter shows the kernel ran.
"""
from __future__ import annotations

import random
import types

import pytest
import torch

import model_factory as mf
from triton_interpret import DEVICE, kernel_modules
from vllm.model_executor.layers.pooler import Pooler, PoolingSlice
from vllm.pooling_params import PoolingParams
from vllm.tasks import PoolingTask as T

pytest.importorskip("triton")

RTOL = ATOL = 1e-6   # float32 accumulation of exact inputs; outputs are O(1)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.fixture(scope="module", autouse=True)
def kernels():
    with kernel_modules(["vllm.attention.ops.triton_pooling"]) as mods:
        yield mods[0]


def _runs(seed: int, total: int) -> tuple[list[int], list[int]]:
    """Ragged runs inside `total` rows: single rows (LAST / CLS), an empty run (a prompt
    covering the whole input), a run over every row and random ones."""
    rng = random.Random(seed)
    starts, counts = [0, total - 1, 3, 0], [1, 1, 0, total]
    for _ in range(5):
        s = rng.randrange(total)
        starts.append(s)
        counts.append(rng.randrange(1, total - s + 1))
    return starts, counts


def _reference(x: torch.Tensor, starts, counts, dims=None) -> torch.Tensor:
    x = x.double().cpu()
    out = torch.stack([x[s:s + c].sum(0) / max(c, 1) for s, c in zip(starts, counts)])
    for i, d in enumerate(dims or []):
        if d:
            out[i] = out[i] / out[i, :d].norm().clamp_min(1e-12)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 80, 300])   # 300: more columns than one tile
def test_pool_rows_matches_float64_reference(kernels, dtype, hidden):
    gen = torch.Generator().manual_seed(hidden)
    x = torch.randn(37, hidden, generator=gen).to(device=DEVICE, dtype=dtype)
    starts, counts = _runs(hidden, 37)
    dims = [hidden, 0, hidden, hidden // 2, 1] + [hidden] * 4
    index = torch.tensor([starts, counts, dims], dtype=torch.int32, device=DEVICE)
    before = kernels.launches["pool_rows"]
    pooled = kernels.pool_rows(x, index[0], index[1])
    normed = kernels.pool_rows(x, index[0], index[1], index[2])
    assert kernels.launches["pool_rows"] == before + 2
    assert pooled.dtype == normed.dtype == torch.float32
    assert torch.equal(pooled[:2].cpu(), x[[0, 36]].float().cpu())   # one row: exact copy
    assert not pooled[2].any()                                      # no row: zeros
    for got, want in ((pooled, _reference(x, starts, counts)),
                      (normed, _reference(x, starts, counts, dims))):
        torch.testing.assert_close(got.double().cpu(), want, rtol=RTOL, atol=ATOL)


def test_l2_normalize_equals_f_normalize(kernels):
    x = torch.randn(6, 96, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    x[2] = 0.0   # a zero row stays zero (eps), as F.normalize
    dims = torch.tensor([96, 96, 96, 10, 0, 96], dtype=torch.int32, device=DEVICE)
    got = kernels.l2_normalize(x, dims).cpu()
    want = torch.nn.functional.normalize(x.cpu(), dim=-1)
    keep = [0, 1, 2, 5]
    torch.testing.assert_close(got[keep], want[keep], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(got[3, :10], torch.nn.functional.normalize(x[3, :10].cpu(),
                                                                           dim=-1))
    assert torch.equal(got[4], x[4].cpu())


# ------------------------------------------------------------------ the pooler's hook

def _pooler(kind: str, backend: str) -> Pooler:
    model = types.SimpleNamespace(head=None, dense=[], model=types.SimpleNamespace(),
                                  attention_backend=backend)
    return Pooler(kind, model, "identity")


def _slices(rng: random.Random, lengths: list[int]) -> list[PoolingSlice]:
    """Whole requests back to back: embeddings with and without normalize or a cut, a
    classification, a left-out prompt (skip) and one longer than its request."""
    slices, start = [], 0
    for i, n in enumerate(lengths):
        params = PoolingParams(task=T.EMBED, normalize=i % 3 != 1,
                               dimensions=16 if i % 4 == 2 else None)
        if i == 3:
            params = PoolingParams(task=T.CLASSIFY, activation=True)
        skip = {4: 2, 5: n + 3}.get(i, 0)
        slices.append(PoolingSlice(start, n, 0, [rng.randrange(9)] * n, params, skip))
        start += n
    return slices


@pytest.mark.parametrize("kind", ["LAST", "CLS", "MEAN"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_pooler_device_path_equals_torch_path(kernels, kind, dtype):
    rng = random.Random(7)
    lengths = [1, 5, 1, 9, 6, 2, 13]
    slices = _slices(rng, lengths)
    hidden = torch.randn(sum(lengths), 48, generator=torch.Generator().manual_seed(3))
    hidden = hidden.to(device=DEVICE, dtype=dtype)
    on_device, in_torch = _pooler(kind, "TRITON_ATTN"), _pooler(kind, "TORCH_SDPA")
    assert on_device.pool_rows is not None and in_torch.pool_rows is None
    before = kernels.launches["pool_rows"]
    got = on_device(hidden, slices)
    assert kernels.launches["pool_rows"] == before + 2   # the rows, then the normalize
    want = in_torch(hidden, slices)
    for g, w in zip(got, want):
        assert g.device.type == "cpu" and g.dtype == torch.float32 and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)
    if kind != "MEAN":   # rows the model already selected: only the normalize runs here
        rows = on_device.rows_needed(slices, DEVICE)
        got = on_device(hidden[rows], slices, selected=True)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------- whole models

def test_whole_model_pools_on_the_kernel(kernels, monkeypatch, qwen2_bidir_dir):
    """A MEAN embedder through TRITON_ATTN, with a one-token prompt: the kernel pooled and
    normalized every step's requests, and the embeddings equal Transformers'."""
    from vllm import LLM
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    llm = LLM(qwen2_bidir_dir, dtype="float32", pooler_config={"pooling_type": "MEAN"})
    prompts = [{"prompt_token_ids": ids} for ids in ([7], [5, 9, 11, 4], list(range(4, 23)))]
    before = kernels.launches["pool_rows"]
    outs = llm.embed(prompts, use_tqdm=False)
    assert llm.llm_engine.runner.pooler.pool_rows is not None
    assert kernels.launches["pool_rows"] - before >= 2
    for out in outs:
        ref = mf.hf_embedding(qwen2_bidir_dir, out.prompt_token_ids, "MEAN", normalize=True,
                              bidirectional=True)
        assert mf.cosine(out.outputs.embedding, ref) >= 0.9999
