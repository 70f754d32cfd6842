// The float ends of an int8 projection: per-token quantization of its input and the
// dequantizing epilogue after the int8 GEMM (torch._int_mm: oneDNN's s8 x s8 -> s32 on
// VNNI or AMX-INT8), so each end is one pass over memory instead of four torch ops.
//
//   quantize:   scale[r] = max|x[r, :]| / 127,  q[r, c] = round(x[r, c] / scale[r])
//   dequantize: out[r, c] = epilogue(acc[r, c] * row_scale[r] * col_scale[c] + bias[c])
//
// The weight is quantized per output channel at load (col_scale) in Python. Rounding is to
// nearest even, as torch.round. Epilogues as skinny_gemm.cpp (epilogue.h); the dequantizing
// span is int8_dequantize.h's, shared with the AVX2 GEMM's fused end. Plain C entry
// points on raw pointers, called through ctypes by vllm/model_executor/layers/int8_linear.py.
#include "int8_dequantize.h"
#include "simd.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

extern "C" {

// Returns 0, or 1 where the library has no SIMD build.
int vllm_quantize_rows(const float* x, int64_t m, int64_t k, int64_t x_row, int8_t* q,
                       float* scales, int threads) {
#if !VLLM_SIMD_WIDTH
  return 1;
#else
#pragma omp parallel for num_threads(std::max(threads, 1)) schedule(static)
  for (int64_t r = 0; r < m; ++r)
    int8_dequantize::quantize_row(x + r * x_row, k, q + r * k, scales + r);
  return 0;
#endif
}

// other: [M, N] of row stride other_row (modes 1, 2) or null; out: [M, N] contiguous.
int vllm_dequantize_rows(const int32_t* acc, int64_t m, int64_t n, const float* row_scales,
                         const float* col_scales, const float* bias, const float* other,
                         int64_t other_row, int mode, float* out, int threads) {
#if !VLLM_SIMD_WIDTH
  return 1;
#else
#pragma omp parallel for num_threads(std::max(threads, 1)) schedule(static)
  for (int64_t r = 0; r < m; ++r)
    int8_dequantize::span(acc + r * n, n, row_scales[r], col_scales, bias,
                          other ? other + r * other_row : nullptr, mode, out + r * n);
  return 0;
#endif
}

// out [m, n] = LayerNorm of x's rows (row stride x_row), weight w [n], bias b [n] or null:
// the formula the fused int8 GEMMs apply in their pass (int8_dequantize.h), for the int8
// paths that normalise after the GEMM, so every path gives the same floats. Returns 0, or
// 1 where the library has no SIMD build.
int vllm_layer_norm_rows(const float* x, int64_t m, int64_t n, int64_t x_row, const float* w,
                         const float* b, float eps, float* out, int threads) {
#if !VLLM_SIMD_WIDTH
  return 1;
#else
#pragma omp parallel for num_threads(std::max(threads, 1)) schedule(static)
  for (int64_t r = 0; r < m; ++r) {
    std::copy(x + r * x_row, x + r * x_row + n, out + r * n);
    int8_dequantize::layer_norm_row(out + r * n, n, w, b, eps);
  }
  return 0;
#endif
}

}  // extern "C"
