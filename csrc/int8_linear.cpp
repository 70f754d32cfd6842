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
  using simd::vf;
  constexpr int W = simd::W;
#pragma omp parallel for num_threads(std::max(threads, 1)) schedule(static)
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * x_row;
    int8_t* qr = q + r * k;
    vf vmax = simd::zero();
    int64_t c = 0;
    for (; c + W <= k; c += W) vmax = simd::max(vmax, simd::abs(simd::load(xr + c)));
    float amax = simd::reduce_max(vmax);
    for (; c < k; ++c) amax = std::max(amax, std::fabs(xr[c]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scales[r] = amax / 127.0f;
    const vf vinv = simd::set1(inv);
    for (c = 0; c + W <= k; c += W) simd::store_i8(qr + c, simd::mul(simd::load(xr + c), vinv));
    for (; c < k; ++c) qr[c] = (int8_t)std::nearbyint(xr[c] * inv);
  }
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

}  // extern "C"
