"""Varlen attention of TRITON_ATTN over the flat, padding-free batch, reading cached keys and
values in place through the block table (no gather into a packed tensor).

One program computes one tile of BLOCK_M query rows of one request for one query head,
with an online softmax (running max and sum, float32) over two key ranges:
1. the request's k cached keys, BLOCK_N per iteration, each found in place through its
   block table row (slot = table[pos // block size] * block size + pos % block size, so a
   tile may span blocks of any size); every cached key precedes every new query;
2. its n new keys, read from the step's flat k/v (the same values the layer has just
   written to the cache), causally masked when the layer is causal.
Grouped-query heads read kv head `h // (Hq // Hkv)`. A sliding window (left, right) masks
keys outside [query - left, query + right] and skips whole tiles outside it; a softcap maps
scores to cap * tanh(score / cap) before the softmax. The head dim is padded to a power of
two with a mask (head size 80 runs in a 128-wide tile). `tile_req` / `tile_start` (built
once per step by the backend) map each program to its request and first query row.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional

import torch
import triton
import triton.language as tl

# Launches per kernel name since import: tests check the kernels really ran.
launches: Counter = Counter()


@triton.jit
def _tile_update(q, kt, v, kpos, key_ok, qpos, m_i, l_i, acc, scale, softcap,
                 win_left, win_right,
                 CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, WINDOW: tl.constexpr,
                 UPCAST: tl.constexpr):
    """One key tile into the online softmax: kt [D, N] and v [N, D] of keys at `kpos`."""
    if UPCAST:  # the interpreter's tl.dot reads bfloat16 as raw bits: float32 there
        q = q.to(tl.float32)
        kt = kt.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, kt, input_precision="ieee") * scale
    if SOFTCAP:
        # tanh(x) = 1 - 2 / (exp(2x) + 1): no tanh op needed, exact at both infinities.
        s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
    ok = key_ok[None, :]
    if CAUSAL:
        ok = ok & (kpos[None, :] <= qpos[:, None])
    if WINDOW:
        ok = ok & (kpos[None, :] >= qpos[:, None] - win_left) \
            & (kpos[None, :] <= qpos[:, None] + win_right)
    s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # rows with no key seen yet
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return m_new, l_i, acc


@triton.jit
def _varlen_attention_kernel(
        out_ptr, q_ptr, k_ptr, v_ptr, cache_ptr, table_ptr,
        tile_req_ptr, tile_start_ptr, q_start_ptr, cached_ptr, new_ptr,
        stride_ot, stride_oh, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
        stride_c_kv, stride_c_s, stride_c_h, stride_table,
        scale, softcap, win_left, win_right,
        GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
        BS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
        SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, UPCAST: tl.constexpr):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    req = tl.load(tile_req_ptr + tile)
    m0 = tl.load(tile_start_ptr + tile)
    row0 = tl.load(q_start_ptr + req).to(tl.int64)
    cached = tl.load(cached_ptr + req)
    n = tl.load(new_ptr + req)

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < D
    row_ok = offs_m < n
    q = tl.load(q_ptr + (row0 + offs_m)[:, None] * stride_qt + head * stride_qh
                + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    qpos = cached + offs_m                 # absolute positions (rows past n: never stored)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)

    # 1. cached keys, in place through the block table (a tile may span blocks)
    lo = 0
    if WINDOW:
        lo = tl.maximum(cached + m0 - win_left, 0)
    for start in range(lo, cached, BLOCK_N):
        kpos = start + offs_n
        key_ok = kpos < cached
        block = tl.load(table_ptr + req * stride_table + kpos // BS, mask=key_ok, other=0)
        slot = block.to(tl.int64) * BS + kpos % BS
        base = cache_ptr + slot * stride_c_s + kv_head * stride_c_h
        kt = tl.load(base[None, :] + offs_d[:, None], mask=key_ok[None, :] & d_ok[:, None],
                     other=0.0)
        v = tl.load(base[:, None] + stride_c_kv + offs_d[None, :],
                    mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        m_i, l_i, acc = _tile_update(q, kt, v, kpos, key_ok, qpos, m_i, l_i, acc, scale,
                                     softcap, win_left, win_right, CAUSAL, SOFTCAP, WINDOW,
                                     UPCAST)

    # 2. the request's new keys, from the step's flat k/v
    lo = 0
    hi = n
    if WINDOW:
        lo = tl.maximum(m0 - win_left, 0)
        hi = tl.minimum(n, m0 + BLOCK_M + win_right)
    if CAUSAL:
        hi = tl.minimum(hi, m0 + BLOCK_M)
    for start in range(lo, hi, BLOCK_N):
        j = start + offs_n
        key_ok = j < n
        rows = row0 + j
        kt = tl.load(k_ptr + rows[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None],
                     mask=key_ok[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_ptr + rows[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                    mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        m_i, l_i, acc = _tile_update(q, kt, v, cached + j, key_ok, qpos, m_i, l_i, acc, scale,
                                     softcap, win_left, win_right, CAUSAL, SOFTCAP, WINDOW,
                                     UPCAST)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + (row0 + offs_m)[:, None] * stride_ot + head * stride_oh
             + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     kv_cache: Optional[torch.Tensor], block_tables: torch.Tensor,
                     tile_req: torch.Tensor, tile_start: torch.Tensor,
                     q_start: torch.Tensor, num_cached: torch.Tensor, num_new: torch.Tensor,
                     *, scale: float, causal: bool, block_size: int, block_m: int,
                     block_n: int,
                     window: Optional[tuple[int, int]] = None,
                     softcap: Optional[float] = None) -> torch.Tensor:
    """q: [T, Hq, D], k/v: [T, Hkv, D] (the step's new rows) -> [T, Hq, D].

    kv_cache: [2, slots, Hkv, D] (None when no request reads cached keys); block_tables:
    int32 [B, W]; tile_req / tile_start: int32 [tiles], each program's request and first
    new-token row; q_start / num_cached / num_new: int32 [B]."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if t == 0:
        return out
    assert q.stride(2) == k.stride(2) == v.stride(2) == 1 and hq % hkv == 0
    cache = kv_cache if kv_cache is not None else k   # never read: no request has k > 0
    if kv_cache is not None:
        assert kv_cache.is_contiguous()
    left, right = window if window is not None else (0, 0)
    _varlen_attention_kernel[(tile_req.shape[0], hq)](
        out, q, k, v, cache, block_tables, tile_req, tile_start, q_start, num_cached,
        num_new, out.stride(0), out.stride(1), q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), v.stride(0), v.stride(1), cache.stride(0), cache.stride(1),
        cache.stride(2), block_tables.stride(0), scale,
        1.0 if softcap is None else float(softcap), left, right,
        GROUP=hq // hkv, D=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BS=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, SOFTCAP=softcap is not None,
        WINDOW=window is not None,
        UPCAST=q.device.type == "cpu" and q.dtype == torch.bfloat16)
    launches["varlen_attention"] += 1
    return out
