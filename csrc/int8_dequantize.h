// The float end of every int8 GEMM: out[c] = epilogue(acc[c] * row_scale * col_scale[c] +
// bias[c]) over a span of a row, and the row quantizer that starts the next one. One
// definition for the separate pass after oneDNN's GEMM (int8_linear.cpp) and the AVX2
// GEMM's fused one (int8_gemm_avx2.cpp), so both paths give the same floats: a column
// takes the vector form where a whole vector of the row holds it, else the scalar one, in
// both (the AVX2 kernel's 16-column blocks are whole vectors).
#pragma once

#include "epilogue.h"
#include "simd.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#if VLLM_SIMD_WIDTH
namespace int8_dequantize {

// acc, col_scales, bias (or null), other (or null: modes 1, 2 only) and dst all point at the
// span's first column; n: the span's columns, up to the row's end.
inline void span(const int32_t* acc, int64_t n, float row_scale, const float* col_scales,
                 const float* bias, const float* other, int mode, float* dst) {
  using simd::vf;
  using namespace epilogue;
  constexpr int W = simd::W;
  const vf vrs = simd::set1(row_scale);
  int64_t c = 0;
  for (; c + W <= n; c += W) {
    vf v = simd::mul(simd::load_i32(acc + c), simd::mul(vrs, simd::load(col_scales + c)));
    if (bias) v = simd::add(v, simd::load(bias + c));
    simd::store(dst + c, vector_epilogue(v, mode, other ? other + c : nullptr));
  }
  for (; c < n; ++c) {
    const float v = (float)acc[c] * (row_scale * col_scales[c]) + (bias ? bias[c] : 0.0f);
    dst[c] = scalar_epilogue(v, mode, other, (int)c);
  }
}

// The start of the next int8 projection: scale = max|x| / 127, q = round(x / scale)
// (nearest even, as torch.round) over one row of k floats. One definition for the separate
// pass (int8_linear.cpp) and the VNNI GEMM's quantized output, so both give the same bytes.
inline void quantize_row(const float* x, int64_t k, int8_t* q, float* scale) {
  using simd::vf;
  constexpr int W = simd::W;
  vf vmax = simd::zero();
  int64_t c = 0;
  for (; c + W <= k; c += W) vmax = simd::max(vmax, simd::abs(simd::load(x + c)));
  float amax = simd::reduce_max(vmax);
  for (; c < k; ++c) amax = std::max(amax, std::fabs(x[c]));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  *scale = amax / 127.0f;
  const vf vinv = simd::set1(inv);
  for (c = 0; c + W <= k; c += W) simd::store_i8(q + c, simd::mul(simd::load(x + c), vinv));
  for (; c < k; ++c) q[c] = (int8_t)std::nearbyint(x[c] * inv);
}

// LayerNorm of one row of k floats in place, as torch.nn.LayerNorm: (x - mean) / sqrt(var
// + eps) * w + b, mean and (biased) variance over the row in float32; two passes over a
// row that is in L1. The fused int8 GEMMs apply it to whole rows after the residual add.
// Written on 8-lane vectors in a fixed order on every build (AVX2 and AVX-512 alike), so
// both give the same floats: int8 rounds the next projection's input, and an ulp here
// moves whole rounding steps there.
inline void layer_norm_row(float* x, int64_t k, const float* w, const float* b, float eps) {
  auto total = [](__m256 v, float tail) {
    alignas(32) float l[8];
    _mm256_store_ps(l, v);
    return (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))) + tail;
  };
  const int64_t k8 = k / 8 * 8;
  __m256 vs = _mm256_setzero_ps();
  float tail = 0.0f;
  for (int64_t c = 0; c < k8; c += 8) vs = _mm256_add_ps(vs, _mm256_loadu_ps(x + c));
  for (int64_t c = k8; c < k; ++c) tail += x[c];
  const float mean = total(vs, tail) / (float)k;
  const __m256 vmean = _mm256_set1_ps(mean);
  __m256 vq = _mm256_setzero_ps();
  tail = 0.0f;
  for (int64_t c = 0; c < k8; c += 8) {
    const __m256 dx = _mm256_sub_ps(_mm256_loadu_ps(x + c), vmean);
    vq = _mm256_fmadd_ps(dx, dx, vq);
  }
  for (int64_t c = k8; c < k; ++c) tail = std::fma(x[c] - mean, x[c] - mean, tail);
  const float rstd = 1.0f / std::sqrt(total(vq, tail) / (float)k + eps);
  const __m256 vr = _mm256_set1_ps(rstd);
  for (int64_t c = 0; c < k8; c += 8) {
    const __m256 y = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), vmean), vr);
    const __m256 wv = _mm256_loadu_ps(w + c);
    _mm256_storeu_ps(x + c, b ? _mm256_fmadd_ps(y, wv, _mm256_loadu_ps(b + c))
                              : _mm256_mul_ps(y, wv));
  }
  for (int64_t c = k8; c < k; ++c) {
    const float y = (x[c] - mean) * rstd;
    x[c] = b ? std::fma(y, w[c], b[c]) : y * w[c];
  }
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && VLLM_SIMD_WIDTH == 16
#define VLLM_INT8_BF16_OUT 1
// k floats rounded to bfloat16 (nearest even, as torch's cast and the bf16 attention
// kernel round them: vcvtneps2bf16 in both), out as uint16 bits.
inline void round_row_bf16(const float* x, int64_t k, uint16_t* out) {
  for (int64_t c = 0; c < k; c += 16) {
    const __mmask16 m = k - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - c)) - 1);
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + c));
    _mm256_mask_storeu_epi16(out + c, m, h);
  }
}
#else
#define VLLM_INT8_BF16_OUT 0
#endif

}  // namespace int8_dequantize
#endif
