"""gpu_check's device-pooling checks: TRITON_ATTN's pooling kernel
(vllm/attention/ops/triton_pooling.py) on the device against the pooler's torch path.

For LAST, CLS and MEAN in each dtype, a step of ragged whole requests (one-token requests, a
left-out prompt, one longer than its request, embeddings with and without normalize or a
`dimensions` cut, a classification) is pooled twice by `Pooler`: once on the kernel (as
with TRITON_ATTN) and once on the torch path. The value is the largest difference relative
to the vector's largest entry; ok within 1e-5 (float32 sums in another order, and the
torch path's index_add_ is itself unordered on a GPU). The kernel's launch counter must
move, so a check cannot pass on the torch path.
"""
from __future__ import annotations

import random
import types
import zlib

import torch

from vllm.model_executor.layers.pooler import Pooler, PoolingSlice
from vllm.pooling_params import PoolingParams
from vllm.tasks import PoolingTask as T

TRITON = "TRITON_ATTN"
REL_TOL = 1e-5
LENGTHS = [1, 5, 1, 90, 6, 2, 300, 1, 33]


def _pooler(kind: str, backend: str) -> Pooler:
    model = types.SimpleNamespace(head=None, dense=[], model=types.SimpleNamespace(),
                                  attention_backend=backend)
    return Pooler(kind, model, "identity")


def _slices() -> list[PoolingSlice]:
    rng = random.Random(0)
    slices, start = [], 0
    for i, n in enumerate(LENGTHS):
        params = PoolingParams(task=T.EMBED, normalize=i % 3 != 1,
                               dimensions=64 if i % 4 == 2 else None)
        if i == 3:
            params = PoolingParams(task=T.CLASSIFY, activation=True)
        skip = {4: 2, 5: n + 3}.get(i, 0)
        slices.append(PoolingSlice(start, n, 0, [rng.randrange(9)] * n, params, skip))
        start += n
    return slices


def _check(device: str, dtype: str, kind: str, hidden_size: int) -> dict:
    from vllm.attention.ops import triton_pooling
    slices = _slices()
    gen = torch.Generator().manual_seed(zlib.crc32(f"{dtype} {kind}".encode()))
    hidden = torch.randn(sum(LENGTHS), hidden_size, generator=gen)
    hidden = hidden.to(device=device, dtype=getattr(torch, dtype))
    before = triton_pooling.launches["pool_rows"]
    got = _pooler(kind, TRITON)(hidden, slices)
    launched = triton_pooling.launches["pool_rows"] - before
    want = _pooler(kind, "TORCH_SDPA")(hidden, slices)
    value = max(((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item()
                for g, w in zip(got, want))
    same_shapes = all(g.shape == w.shape for g, w in zip(got, want))
    return {"name": f"pooling {kind} {dtype} {TRITON} kernel vs torch", "task": "pooling",
            "value": value, "launches": launched,
            "ok": launched > 0 and same_shapes and value <= REL_TOL}


def pooling_pass(device: str, dtypes: list[str], quick: bool) -> dict:
    """{"checks": one per pooling type and dtype (float16 added on a full run), each
    guarded}, or {"skipped": why} where TRITON_ATTN cannot run."""
    from gpu_check_parts import backend_unavailable, guarded
    wanted = dtypes if quick else sorted({*dtypes, "float16"})
    runnable = [d for d in wanted if not backend_unavailable(device, TRITON, d)]
    if not runnable:
        why_not = backend_unavailable(device, TRITON, wanted[0])
        print(f"skip pooling kernel checks: {why_not}", flush=True)
        return {"skipped": why_not}
    hidden_size = 64 if quick else 1024
    checks: list[dict] = []
    for dtype in runnable:
        for kind in ("LAST", "CLS", "MEAN"):
            guarded(checks, f"pooling {kind} {dtype} {TRITON}", "pooling",
                    lambda dtype=dtype, kind=kind: [_check(device, dtype, kind, hidden_size)])
    return {"checks": checks}


def pooling_failures(result: dict) -> list[str]:
    return [c["name"] for c in result.get("checks", []) if not c["ok"]]


def print_pooling(result: dict) -> None:
    if "skipped" in result:
        print(f"pooling kernel checks: skipped ({result['skipped']})")
    for check in result.get("checks", []):
        print(f"{'ok  ' if check['ok'] else 'FAIL'} {check['name']:<52} max rel "
              f"{check['value']:.2e}")
