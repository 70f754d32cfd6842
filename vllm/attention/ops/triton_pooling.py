"""The pooler's reductions on the device for TRITON_ATTN: LAST / CLS / MEAN rows of the flat,
padding-free batch, and L2 normalize, in one Triton kernel.

Every pooled vector is a mean over one contiguous run of flat rows, `starts[i]` ..
`starts[i] + counts[i] - 1`, divided by max(count, 1) in float32: LAST and CLS are a run of
one row (a float32 copy of it, exactly), MEAN the request's rows after any left-out prompt
(none: zeros, as sentence-transformers' clamped mean). With `norm_dims`, a row with
`norm_dims[i] > 0` is then divided by max(||v[:norm_dims[i]]||, 1e-12), as `F.normalize`
of the first `norm_dims[i]` values (an embedding's `dimensions` cut; the columns past it are
the caller's to drop). A program sums BLOCK_T rows at a time over BLOCK_H columns of one
output row; the row's column tiles go to programs of their own, except when normalizing,
where one program walks the whole row and takes a second pass over what it has written.

The pooler calls this through the backend (`TritonAttentionBackend.pool_rows`), so the
index lists travel to the device in one small copy and the pooled rows come back to the
host in one transfer, where the torch path built a per-token segment map on the host and
copied each request's vector back on its own. Imported lazily, like the attention kernels
(`@triton.jit` fixes interpreter or compiled mode at import).
"""
from __future__ import annotations

from collections import Counter
from typing import Optional

import torch
import triton
import triton.language as tl

# Launches per kernel name since import: tests check the kernels really ran.
launches: Counter = Counter()

NORM_EPS = 1e-12   # F.normalize's default


@triton.jit
def _pool_rows_kernel(x_ptr, out_ptr, start_ptr, count_ptr, dims_ptr, stride_x, stride_o,
                      H, eps, NORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr,
                      BLOCK_H: tl.constexpr):
    i = tl.program_id(0)
    start = tl.load(start_ptr + i).to(tl.int64)
    count = tl.load(count_ptr + i)
    denom = tl.maximum(count, 1).to(tl.float32)
    offs_t = tl.arange(0, BLOCK_T)
    offs_h = tl.arange(0, BLOCK_H)
    out_row = out_ptr + i.to(tl.int64) * stride_o
    dims = 0
    if NORMALIZE:
        dims = tl.load(dims_ptr + i)
    squares = tl.full([BLOCK_H], 0.0, tl.float32)
    # column tiles: this program's, one in every num_programs(1) (all of them to normalize)
    for h0 in range(tl.program_id(1) * BLOCK_H, H, tl.num_programs(1) * BLOCK_H):
        cols = h0 + offs_h
        col_ok = cols < H
        acc = tl.full([BLOCK_T, BLOCK_H], 0.0, tl.float32)
        for t0 in range(0, count, BLOCK_T):
            rows = start + t0 + offs_t
            ok = ((t0 + offs_t) < count)[:, None] & col_ok[None, :]
            acc += tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=ok,
                           other=0.0).to(tl.float32)
        mean = tl.div_rn(tl.sum(acc, 0), denom)   # IEEE division, as torch's
        tl.store(out_row + cols, mean, mask=col_ok)
        if NORMALIZE:
            squares += tl.where(cols < dims, mean * mean, 0.0)
    if NORMALIZE:
        tl.debug_barrier()   # the row's stores above, before this program reads them back
        if dims > 0:
            norm = tl.maximum(tl.sqrt_rn(tl.sum(squares, 0)), eps)
            for h0 in range(0, H, BLOCK_H):
                cols = h0 + offs_h
                col_ok = cols < H
                v = tl.load(out_row + cols, mask=col_ok, other=0.0)
                tl.store(out_row + cols, tl.div_rn(v, norm), mask=col_ok)


def pool_rows(x: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor,
              norm_dims: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x: [T, H]; starts / counts: int32 [N] on x's device; norm_dims:
    optional int32 [N] (0: leave the row as pooled) -> float32 [N, H] (see module doc)."""
    n, h = starts.shape[0], x.shape[1]
    out = torch.empty(n, h, dtype=torch.float32, device=x.device)
    if n == 0:
        return out
    assert starts.shape == counts.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    block_h = min(triton.next_power_of_2(h), 256)
    # Without normalize, each row's column tiles go to programs of their own (a single long
    # MEAN request still spreads over the device); a normalized row stays in one program.
    tiles = 1 if norm_dims is not None else triton.cdiv(h, block_h)
    _pool_rows_kernel[(n, tiles)](
        x, out, starts, counts, norm_dims if norm_dims is not None else counts,
        x.stride(0), out.stride(0), h, NORM_EPS, NORMALIZE=norm_dims is not None,
        BLOCK_T=16, BLOCK_H=block_h)
    launches["pool_rows"] += 1
    return out


def l2_normalize(x: torch.Tensor, dims: torch.Tensor) -> torch.Tensor:
    """Row i of x [N, H] (float32, contiguous rows) divided by the L2 norm of its first
    `dims[i]` values (rows with dims 0 unchanged) -> a new float32 [N, H]."""
    n = x.shape[0]
    index = torch.arange(n, dtype=torch.int32, device=x.device)
    return pool_rows(x, index, torch.ones_like(index), dims)
