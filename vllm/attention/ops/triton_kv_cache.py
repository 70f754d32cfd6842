"""The KV write of TRITON_ATTN: the step's new keys and values into their paged-cache slots.

One program per new token copies its [Hkv, D] key and value rows to `slot_mapping[t]` of
`kv_cache[0]` and `kv_cache[1]` (one launch for both, where `index_copy_` takes two).
A negative slot is skipped (a row with no cache slot).
"""
from __future__ import annotations

from collections import Counter

import torch
import triton
import triton.language as tl

# Launches per kernel name since import: tests check the kernels really ran.
launches: Counter = Counter()


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_c_kv, stride_c_s, stride_c_h,
                     H: tl.constexpr, D: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        mask = (offs_h[:, None] < H) & (offs_d[None, :] < D)
        row = t.to(tl.int64)
        key = tl.load(k_ptr + row * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :],
                      mask=mask)
        value = tl.load(v_ptr + row * stride_vt + offs_h[:, None] * stride_vh
                        + offs_d[None, :], mask=mask)
        dst = cache_ptr + slot * stride_c_s + offs_h[:, None] * stride_c_h + offs_d[None, :]
        tl.store(dst, key, mask=mask)
        tl.store(dst + stride_c_kv, value, mask=mask)


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v: [T, Hkv, D] (last dim contiguous); kv_cache: [2, slots, Hkv, D] contiguous;
    slot_mapping: [T] integer slots."""
    t, h, d = k.shape
    if t == 0:
        return
    assert k.stride(2) == 1 and v.stride(2) == 1 and kv_cache.is_contiguous()
    _write_kv_kernel[(t,)](
        k, v, kv_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2),
        H=h, D=d, BLOCK_H=triton.next_power_of_2(h), BLOCK_D=triton.next_power_of_2(d))
    launches["write_kv"] += 1
