"""Tensor-level calls into the C++ kernel library (ctypes, raw data pointers).

The library takes pointers, sizes and strides; these wrappers check what it cannot
(dtypes, ranks, unit strides, devices), allocate the output, pass torch's thread count,
and raise RuntimeError with the library's message where it refuses its input. ctypes
releases the GIL for the call.
"""
from __future__ import annotations

import ctypes
from typing import Callable, Optional

import torch

_NO_INDEX = torch.empty(0, dtype=torch.long)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


def _index(t: torch.Tensor, name: str) -> tuple[int, int]:
    """(data pointer or 0, length) of an optional int64 index."""
    if t.numel() == 0:
        return 0, 0
    _check(t.dtype == torch.long and t.is_contiguous(), f"{name} must be a contiguous int64 "
           "tensor")
    return t.data_ptr(), t.numel()


def _attention_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    q_offsets: torch.Tensor, k_offsets: torch.Tensor, key_rows: torch.Tensor,
                    tile_ids: torch.Tensor, name: str) -> tuple:
    """The checked pointer/stride arguments the attention kernels share, from q's onwards:
    (q, k, v pointers and strides, hq, hkv, d, offsets, b, key_rows, tile_ids) and the
    offsets tensors, which must outlive the call."""
    _check(q.dim() == 3 and k.dim() == 3 and v.dim() == 3, "q, k, v must be [T, H, D]")
    _check(all(x.device.type == "cpu" for x in (q, k, v)), f"{name}: CPU tensors only")
    _check(q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1,
           "q, k, v need unit stride in D")
    _check(k.shape[1:] == v.shape[1:] and k.shape[2] == q.shape[2],
           "k and v must be [T, Hkv, D] with q's D")
    qo, ko = (x.to(torch.long).contiguous() for x in (q_offsets, k_offsets))
    _check(qo.numel() == ko.numel() and qo.numel() > 0, "q_offsets and k_offsets differ in "
           "length")
    (rows, n_rows), (tiles, n_tiles) = _index(key_rows, "key_rows"), _index(tile_ids, "tile_ids")
    args = (q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
            v.data_ptr(), v.stride(0), v.stride(1))
    shape = (q.shape[1], k.shape[1], q.shape[2], qo.data_ptr(), ko.data_ptr(), qo.numel() - 1,
             rows, n_rows, tiles, n_tiles)
    return args, shape, (qo, ko)


def varlen_attention(lib: ctypes.CDLL, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     q_offsets: torch.Tensor, k_offsets: torch.Tensor, key_rows: torch.Tensor,
                     tile_ids: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """Attention over packed sequences (csrc/varlen_attention.cpp): out [Tq, Hq, D]."""
    _check(all(x.dtype == torch.float32 for x in (q, k, v)), "varlen_attention: float32 only")
    args, shape, _keep = _attention_args(q, k, v, q_offsets, k_offsets, key_rows, tile_ids,
                                         "varlen_attention")
    out = torch.empty((q.shape[0], q.shape[1], q.shape[2]), dtype=torch.float32)
    err = ctypes.create_string_buffer(200)
    if lib.vllm_varlen_attention(*args, out.data_ptr(), *shape, scale, int(causal),
                                 torch.get_num_threads(), err, len(err)):
        raise RuntimeError(err.value.decode())
    return out


def varlen_attention_bf16(lib: ctypes.CDLL, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          q_offsets: torch.Tensor, k_offsets: torch.Tensor,
                          key_rows: torch.Tensor, tile_ids: torch.Tensor, scale: float,
                          causal: bool, out_dtype: torch.dtype = torch.bfloat16,
                          bf16_pv: bool = False) -> torch.Tensor:
    """`varlen_attention` on bfloat16 q/k/v, Q*K^T with vdpbf16ps, softmax and sums in
    float32, P*V in float32 (bf16_pv: on P rounded to bfloat16, with vdpbf16ps; less exact)
    (csrc/varlen_attention_bf16.cpp): out [Tq, Hq, D] in out_dtype (bfloat16 or float32).
    float32 q/k/v are read as they are: q and k rounded to bfloat16 where the kernel copies
    them (the same scores as casting them first), V kept float32 unless bf16_pv."""
    _check(all(x.dtype == q.dtype for x in (k, v)) and q.dtype in (torch.bfloat16,
                                                                  torch.float32),
           "varlen_attention_bf16: q, k, v all bfloat16 or all float32")
    _check(out_dtype in (torch.bfloat16, torch.float32),
           "varlen_attention_bf16: out_dtype must be bfloat16 or float32")
    args, shape, _keep = _attention_args(q, k, v, q_offsets, k_offsets, key_rows, tile_ids,
                                         "varlen_attention_bf16")
    out = torch.empty((q.shape[0], q.shape[1], q.shape[2]), dtype=out_dtype)
    err = ctypes.create_string_buffer(200)
    if lib.vllm_varlen_attention_bf16(*args, out.data_ptr(), int(out_dtype == torch.bfloat16),
                                      int(bf16_pv), int(q.dtype == torch.float32), *shape,
                                      scale, int(causal), torch.get_num_threads(), err,
                                      len(err)):
        raise RuntimeError(err.value.decode())
    return out


def rms_norm(lib: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor,
             eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, one pass per row (csrc/rms_norm.cpp)."""
    _check(x.dtype in (torch.float32, torch.bfloat16), "rms_norm: float32 or bfloat16 only")
    _check(weight.dtype == x.dtype, "rms_norm: weight must have x's dtype")
    _check(x.device.type == "cpu" and weight.device.type == "cpu", "rms_norm: CPU tensors only")
    _check(x.dim() in (2, 3), "rms_norm: x must be [N, D] or [N0, N1, D]")
    d = x.shape[-1]
    _check(x.stride(-1) == 1, "rms_norm: the last dimension must have unit stride")
    _check(weight.dim() == 1 and weight.shape[0] == d and weight.is_contiguous(),
           "rms_norm: weight must be a contiguous [D] vector")
    out = torch.empty(x.shape, dtype=x.dtype)
    n1, s1 = (x.shape[1], x.stride(1)) if x.dim() == 3 else (1, 0)
    lib.vllm_rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], n1,
                      x.stride(0), s1, d, eps, int(x.dtype == torch.bfloat16),
                      torch.get_num_threads())
    return out


def _epilogue_args(name: str, x: torch.Tensor, k: int, n: int,
                   bias: Optional[torch.Tensor], mode: int,
                   other: Optional[torch.Tensor]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """x and other (None unless mode 1 or 2) with unit column stride, checked: float32
    [M, k] rows, bias a contiguous [n], other [M, n]."""
    _check(x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] == k,
           f"{name}: x must be float32 [M, {k}]")
    if x.stride(1) != 1:
        x = x.contiguous()
    if bias is not None:
        _check(bias.dtype == torch.float32 and bias.shape == (n,) and bias.is_contiguous(),
               f"{name}: bias must be a contiguous float32 [{n}]")
    if mode not in (1, 2):
        return x, None
    _check(other is not None and other.dtype == torch.float32 and
           other.shape == (x.shape[0], n), f"{name}: other must be float32 [{x.shape[0]}, {n}]")
    return x, other if other.stride(1) == 1 else other.contiguous()


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def skinny_gemm(lib: ctypes.CDLL, x: torch.Tensor, weight_ptr: int, n: int, k: int, kp: int,
                nb: int, bias: Optional[torch.Tensor], mode: int,
                other: Optional[torch.Tensor]) -> torch.Tensor:
    """(x @ W.T + bias) [mode 1: + other, 2: * other; 3 / 4 / 5: GELU / SiLU / ReLU of it]
    for a few rows of x, W packed by oneDNN in blocks of nb columns of [kp][nb]
    (csrc/skinny_gemm.cpp): out [M, n]."""
    x, other = _epilogue_args("skinny_gemm", x, k, n, bias, mode, other)
    out = torch.empty((x.shape[0], n), dtype=torch.float32)
    if lib.vllm_skinny_gemm(x.data_ptr(), x.shape[0], k, x.stride(0), weight_ptr, n, kp, nb,
                            _ptr(bias), _ptr(other), 0 if other is None else other.stride(0),
                            mode, out.data_ptr(), n, torch.get_num_threads()):
        raise RuntimeError(f"skinny_gemm: the kernel refused blocks of {nb} columns")
    return out


def f32_gemm(lib: ctypes.CDLL, x: torch.Tensor, packed: torch.Tensor, n: int,
             bias: Optional[torch.Tensor], mode: int, other: Optional[torch.Tensor] = None,
             norm: Optional[tuple] = None) -> torch.Tensor:
    """(x @ W.T + bias) [mode as skinny_gemm's], then where `norm` = (weight [n], bias [n] or
    None, eps) each row layer-normed, in the GEMM's last pass (csrc/f32_gemm.cpp); W packed
    as [blocks, k, block] (layers/f32_gemm.pack): out [M, n]."""
    _check(packed.dtype == torch.float32 and packed.dim() == 3 and packed.is_contiguous() and
           packed.shape[2] == lib.vllm_f32_gemm_block() and packed.shape[0] *
           packed.shape[2] >= n, "f32_gemm: the weight is not packed for this library")
    k = packed.shape[1]
    x, other = _epilogue_args("f32_gemm", x, k, n, bias, mode, other)
    norm_w, norm_b, eps = norm if norm is not None else (None, None, 0.0)
    for t in (norm_w, norm_b):
        _check(t is None or (t.dtype == torch.float32 and t.shape == (n,) and
                             t.is_contiguous()), f"f32_gemm: norm weights must be float32 [{n}]")
    out = torch.empty((x.shape[0], n), dtype=torch.float32)
    lib.vllm_f32_gemm(x.data_ptr(), x.shape[0], k, x.stride(0), packed.data_ptr(), n,
                      _ptr(bias), _ptr(other), 0 if other is None else other.stride(0), mode,
                      _ptr(norm_w), _ptr(norm_b), eps, out.data_ptr(), n,
                      torch.get_num_threads())
    return out


def quantize_rows(lib: ctypes.CDLL, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8 of float32 [M, K] rows (csrc/int8_linear.cpp): (q [M, K] int8,
    scales [M] float32) with x ~ q * scales[:, None]."""
    _check(x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1,
           f"x must be float32 [M, K] with unit column stride; got {x.dtype} {tuple(x.shape)}")
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.int8)
    scales = torch.empty(m, dtype=torch.float32)
    _check(lib.vllm_quantize_rows(x.data_ptr(), m, k, x.stride(0), q.data_ptr(),
                                  scales.data_ptr(), torch.get_num_threads()) == 0,
           "quantize_rows: the kernel library has no SIMD build")
    return q, scales


def layer_norm_rows(lib: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor,
                    bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """LayerNorm of float32 [M, N] rows (unit column stride) as the fused int8 GEMMs apply
    it (csrc/int8_linear.cpp): float32 [M, N]."""
    _check(x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1,
           f"x must be float32 [M, N] with unit column stride; got {x.dtype} {tuple(x.shape)}")
    m, n = x.shape
    w, b, eps = _norm_args((weight, bias, eps), n)
    out = torch.empty((m, n), dtype=torch.float32)
    _check(lib.vllm_layer_norm_rows(x.data_ptr(), m, n, x.stride(0), w, b, eps,
                                    out.data_ptr(), torch.get_num_threads()) == 0,
           "layer_norm_rows: the kernel library has no SIMD build")
    return out


def _check_epilogue(bias: Optional[torch.Tensor], other: Optional[torch.Tensor], m: int,
                    n: int) -> None:
    """The optional epilogue inputs of an [m, n] int32 GEMM result: bias [n], other [m, n]."""
    if bias is not None:
        _check(bias.dtype == torch.float32 and bias.is_contiguous() and bias.numel() == n,
               f"bias must be contiguous float32 [{n}]")
    if other is not None:
        _check(other.dtype == torch.float32 and other.shape == (m, n) and other.stride(1) == 1,
               f"other must be float32 [{m}, {n}] with unit column stride")


def dequantize_rows(lib: ctypes.CDLL, acc: torch.Tensor, row_scales: torch.Tensor,
                    col_scales: torch.Tensor, bias: Optional[torch.Tensor], mode: int,
                    other: Optional[torch.Tensor] = None) -> torch.Tensor:
    """epilogue(acc * row_scales[:, None] * col_scales + bias) for an int32 [M, N] GEMM
    result, as float32 [M, N]; mode as skinny_gemm's (1 add / 2 multiply `other`)."""
    m, n = acc.shape
    _check(acc.dtype == torch.int32 and acc.is_contiguous(), "acc must be contiguous int32")
    _check(row_scales.numel() == m and col_scales.numel() == n, "scales do not fit acc")
    _check_epilogue(bias, other, m, n)
    out = torch.empty((m, n), dtype=torch.float32)
    _check(lib.vllm_dequantize_rows(
        acc.data_ptr(), m, n, row_scales.data_ptr(), col_scales.data_ptr(),
        0 if bias is None else bias.data_ptr(), 0 if other is None else other.data_ptr(),
        0 if other is None else other.stride(0), mode, out.data_ptr(),
        torch.get_num_threads()) == 0, "dequantize_rows: the kernel library has no SIMD build")
    return out


def _packed_gemm_args(q: torch.Tensor, packed: torch.Tensor, n: int, block: int,
                      row_scales: torch.Tensor, col_scales: torch.Tensor,
                      bias: Optional[torch.Tensor], other: Optional[torch.Tensor],
                      floats: bool = True, group: int = 4) -> tuple:
    """The checked operands of a fused int8 GEMM over a packed weight
    ([ceil(n / block), ceil(K / group), block, group]) and its output: (m, k, out float32
    [m, n] (empty where not `floats`), the pointers of bias and other and other's row
    stride)."""
    _check(q.dtype == torch.int8 and q.dim() == 2 and q.stride(1) == 1,
           f"q must be int8 [M, K] with unit column stride; got {q.dtype} {tuple(q.shape)}")
    m, k = q.shape
    shape = (-(-n // block), -(-k // group), block, group)
    _check(packed.dtype == torch.int8 and tuple(packed.shape) == shape and
           packed.is_contiguous(), f"packed must be contiguous int8 {shape}")
    _check(row_scales.dtype == col_scales.dtype == torch.float32 and row_scales.numel() == m
           and col_scales.numel() == n and row_scales.is_contiguous() and
           col_scales.is_contiguous(), f"scales must be contiguous float32 [{m}] and [{n}]")
    _check_epilogue(bias, other, m, n)
    return (m, k, torch.empty((m, n) if floats else (0,), dtype=torch.float32),
            0 if bias is None else bias.data_ptr(), 0 if other is None else other.data_ptr(),
            0 if other is None else other.stride(0))


def avx2_group(lib: ctypes.CDLL) -> int:
    """k per packed group of the AVX2 kernel's weight: 2 (`vpmaddwd` pairs), or 4 in
    libraries built before it said (their kernel read the VNNI kernel's layout)."""
    return lib.vllm_int8_gemm_avx2_group() if hasattr(lib, "vllm_int8_gemm_avx2_group") \
        else 4


def int8_gemm_avx2(lib: ctypes.CDLL, q: torch.Tensor, packed: torch.Tensor, n: int,
                   row_scales: torch.Tensor, col_scales: torch.Tensor,
                   bias: Optional[torch.Tensor], mode: int,
                   other: Optional[torch.Tensor] = None, quantized: bool = False,
                   floats: bool = True, norm: Optional[tuple] = None,
                   out_dtype: torch.dtype = torch.float32):
    """q [M, K] int8 (unit column stride) x the int8 weight of n output columns packed for
    csrc/int8_gemm_avx2.cpp (`pack_avx2(group=2)`: [ceil(n / 16), ceil(K / 2), 16, 2]),
    exact int32 sums turned back to float in the same pass as `dequantize_rows` does:
    float32 [M, n]. `quantized`, `floats`, `norm`, `out_dtype` as `int8_gemm_vnni`'s
    (libraries from session 22 on: `vllm_int8_gemm_avx2_fused`)."""
    m, k, out, bias_ptr, other_ptr, other_row = _packed_gemm_args(
        q, packed, n, lib.vllm_int8_gemm_avx2_block(), row_scales, col_scales, bias, other,
        floats and out_dtype == torch.float32, group=avx2_group(lib))
    if not hasattr(lib, "vllm_int8_gemm_avx2_fused"):
        _check(not quantized and floats and norm is None and out_dtype == torch.float32,
               "int8_gemm_avx2: this kernel library has no fused float end (rebuild it)")
        _check(lib.vllm_int8_gemm_avx2(
            q.data_ptr(), m, k, q.stride(0), packed.data_ptr(), n, row_scales.data_ptr(),
            col_scales.data_ptr(), bias_ptr, other_ptr, other_row, mode, out.data_ptr(),
            torch.get_num_threads()) == 0,
            "int8_gemm_avx2: the kernel library was built without AVX2")
        return out
    pointers, result = _outputs(out, m, n, quantized, floats, out_dtype)
    rc = lib.vllm_int8_gemm_avx2_fused(
        q.data_ptr(), m, k, q.stride(0), packed.data_ptr(), n, row_scales.data_ptr(),
        col_scales.data_ptr(), bias_ptr, other_ptr, other_row, mode, *_norm_args(norm, n),
        *pointers, torch.get_num_threads())
    _check(rc != 1, "int8_gemm_avx2: the kernel library was built without AVX2")
    _check(rc != 3, "int8_gemm_avx2: a bfloat16 output needs a build with AVX512-BF16")
    return result()


def _outputs(out: torch.Tensor, m: int, n: int, quantized: bool, floats: bool,
             out_dtype: torch.dtype) -> tuple[tuple, Callable[[], object]]:
    """A fused int8 GEMM's output pointers (bf16_out, out, q_out, q_scales) and what it
    returns after the call: out float32 [m, n]; or bfloat16 [m, n] (out_dtype: each row
    rounded in the pass, no floats written); or, `quantized`, (out, q_out int8 [m, n],
    scales [m]), out then a zero-stride stand-in of its shape where not `floats`."""
    _check(out_dtype in (torch.float32, torch.bfloat16), "out_dtype must be float32 or "
           "bfloat16")
    _check(floats or quantized, "floats=False needs quantized=True")
    bf16 = out_dtype == torch.bfloat16
    _check(not (bf16 and quantized), "a bfloat16 output is not also quantized")
    q_out = torch.empty((m, n), dtype=torch.int8) if quantized else None
    q_scales = torch.empty(m, dtype=torch.float32) if quantized else None
    rounded = torch.empty((m, n), dtype=torch.bfloat16) if bf16 else None
    pointers = (rounded.data_ptr() if bf16 else 0, out.data_ptr() if floats and not bf16
                else 0, q_out.data_ptr() if quantized else 0,
                q_scales.data_ptr() if quantized else 0)

    def result():
        if bf16:
            return rounded
        if q_out is None:
            return out
        return (out if floats else out.new_zeros(n).expand(m, n)), q_out, q_scales
    return pointers, result


def _norm_args(norm: Optional[tuple], n: int) -> tuple:
    """(weight pointer, bias pointer, eps) of a LayerNorm fused after the epilogue (norm:
    (weight [n], bias [n] or None, eps), float32 contiguous), or null pointers."""
    if norm is None:
        return 0, 0, 0.0
    w, b, eps = norm
    for t in (w, b):
        _check(t is None or (t.dtype == torch.float32 and t.shape == (n,) and
                             t.is_contiguous()), f"norm weight and bias must be contiguous "
               f"float32 [{n}]")
    _check(w is not None, "norm needs a weight")
    return w.data_ptr(), 0 if b is None else b.data_ptr(), float(eps)


def int8_gemm_vnni(lib: ctypes.CDLL, q: torch.Tensor, packed: torch.Tensor,
                   comp: torch.Tensor, n: int, row_scales: torch.Tensor,
                   col_scales: torch.Tensor, bias: Optional[torch.Tensor], mode: int,
                   other: Optional[torch.Tensor] = None, quantized: bool = False,
                   floats: bool = True, norm: Optional[tuple] = None,
                   out_dtype: torch.dtype = torch.float32):
    """As `int8_gemm_avx2` on csrc/int8_gemm_vnni.cpp (AVX512-VNNI): the same packed
    weight, plus comp int32 [ceil(n / 16) * 16], 128 times each column's weight sum.
    `quantized`: (out, q_out [M, n] int8, scales [M]), out's rows as `quantize_rows`
    gives them, made in the same pass; `floats=False` (with `quantized`): out is not
    written (see `_outputs`), only the quantized rows are made. `norm` (weight, bias or
    None, eps): each output row layer-normed after the epilogue, in the same pass.
    `out_dtype=torch.bfloat16`: the rows rounded to bfloat16 in the pass (AVX512-BF16
    builds), as `.to(torch.bfloat16)` would round the floats."""
    m, k, out, bias_ptr, other_ptr, other_row = _packed_gemm_args(
        q, packed, n, lib.vllm_int8_gemm_avx2_block(), row_scales, col_scales, bias, other,
        floats and out_dtype == torch.float32)
    _check(comp.dtype == torch.int32 and comp.is_contiguous() and
           comp.numel() == packed.shape[0] * 16, "comp must be contiguous int32 "
           f"[{packed.shape[0] * 16}]")
    pointers, result = _outputs(out, m, n, quantized, floats, out_dtype)
    rc = lib.vllm_int8_gemm_vnni(
        q.data_ptr(), m, k, q.stride(0), packed.data_ptr(), comp.data_ptr(), n,
        row_scales.data_ptr(), col_scales.data_ptr(), bias_ptr, other_ptr, other_row, mode,
        *_norm_args(norm, n), *pointers, torch.get_num_threads())
    _check(rc != 1, "int8_gemm_vnni: the kernel library was built without AVX512-VNNI")
    _check(rc != 3, "int8_gemm_vnni: a bfloat16 output needs a build with AVX512-BF16")
    return result()


# bytes the AMX kernel may read past a packed weight's end (csrc/int8_gemm_amx.cpp)
AMX_SLACK = 1024


def int8_gemm_amx(lib: ctypes.CDLL, q: torch.Tensor, packed: torch.Tensor, n: int,
                  row_scales: torch.Tensor, col_scales: torch.Tensor,
                  bias: Optional[torch.Tensor], mode: int,
                  other: Optional[torch.Tensor] = None, quantized: bool = False,
                  floats: bool = True, norm: Optional[tuple] = None,
                  out_dtype: torch.dtype = torch.float32):
    """As `int8_gemm_vnni` on csrc/int8_gemm_amx.cpp (AMX-INT8 tiles, s8 x s8: no comp);
    packed must have AMX_SLACK readable bytes after it in its storage (`pack_avx2(slack=)`)."""
    m, k, out, bias_ptr, other_ptr, other_row = _packed_gemm_args(
        q, packed, n, lib.vllm_int8_gemm_avx2_block(), row_scales, col_scales, bias, other,
        floats and out_dtype == torch.float32)
    _check(packed.untyped_storage().nbytes() - packed.storage_offset() >=
           packed.numel() + AMX_SLACK, f"packed needs {AMX_SLACK} bytes of slack after it "
           "in its storage (pack_avx2(q, slack=AMX_SLACK))")
    pointers, result = _outputs(out, m, n, quantized, floats, out_dtype)
    rc = lib.vllm_int8_gemm_amx(
        q.data_ptr(), m, k, q.stride(0), packed.data_ptr(), n, row_scales.data_ptr(),
        col_scales.data_ptr(), bias_ptr, other_ptr, other_row, mode, *_norm_args(norm, n),
        *pointers, torch.get_num_threads())
    _check(rc != 1, "int8_gemm_amx: the kernel library was built without AMX-INT8")
    _check(rc != 2, "int8_gemm_amx: Linux refused this process AMX's tile state "
           "(arch_prctl ARCH_REQ_XCOMP_PERM)")
    _check(rc != 3, "int8_gemm_amx: a bfloat16 output needs a build with AVX512-BF16")
    return result()
