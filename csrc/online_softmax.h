// The online (flash-style) softmax step of a query block, shared by the float32 and
// bfloat16 attention kernels (varlen_attention.cpp, varlen_attention_bf16.cpp).
//
// It runs in passes over all of the block's rows rather than row by row: a row's work is a
// serial chain (its max, the max's reduction, exp, the sum's reduction), and separate
// passes let the chains of different rows overlap; the accumulator factors
// exp(m_old - m_new) of W rows come from one vector exp instead of W scalar ones.
#pragma once

#include "simd.h"

#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <limits>

#if VLLM_SIMD_WIDTH
namespace varlen {

// A block's per-row softmax state ([BQ] each, BQ a multiple of W): running max m and sum
// l ([BQ][kSums]: kSums partial sums a row, added up once, by row_sum, when the row is done;
// a horizontal add per row and block cost the bf16 kernel ~8%), the keys each row sees in
// this key block (valid), and scratch.
//
// The partial sums are laid out alike on both widths (partial i: the keys 16 u + i; AVX2
// keeps two vectors of 8) and row_sum adds them in one fixed order, so the AVX2 and
// AVX-512 builds give the same sums and, every other step being per lane in the same
// order, the same attention bit for bit (an int8 model rounds the next projection's input,
// where an ulp here moves whole rounding steps).
constexpr int kSums = 16;
struct SoftmaxRows {
  float* m;
  float* l;
  const int* valid;
  float* m_new;
  float* corr;
};

// Scores s[r * stride + j] of rows 0 .. rows - 1 (rows <= BQ) against this key block's
// first `cols` keys become weights exp(scale * (s - m)), m the row's running max of the
// unscaled scores (scale > 0): emit(r, u, e) stores row r's u-th vector of weights e (0 past
// valid[r]) where P*V reads them and returns the values it stored, whose sum joins l;
// clear(r) zeroes a row that sees no key here. Each row's accumulator acc[r * d : (r + 1) *
// d] is rescaled to the new max. The weights are 2^((s - m) * scale * log2 e), the scale
// folded into the base change; COARSE: for weights emit rounds to bfloat16, from one FMA
// and a degree-4 exp2 (simd.h).
template <bool COARSE, class Emit, class Clear>
inline void online_softmax(const float* s, int stride, int rows, int cols, float scale,
                           const SoftmaxRows st, float* acc, int d, Emit emit, Clear clear) {
  using simd::vf;
  using simd::W;
  const int n = (cols + W - 1) / W;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float c = scale * 1.44269504088896341f;
  const vf vc = simd::set1(c);
  for (int r = 0; r < rows; ++r) {  // pass 1: each row's new running max
    const float* x = s + r * stride;
    const int valid = st.valid[r];
    vf vmax = simd::set1(neg_inf);
    for (int u = 0; u < n; ++u)
      vmax = simd::max(vmax, simd::load_first(x + W * u, valid - W * u, neg_inf));
    st.m_new[r] = valid > 0 ? std::max(st.m[r], simd::reduce_max(vmax)) : st.m[r];
  }
  for (int r = 0; r < rows; r += W) {  // pass 2: the factors, W rows per exp (m = -inf: 0)
    const vf old = simd::load(st.m + r);
    const vf keep = simd::exp2(simd::mul(simd::sub(old, simd::load(st.m_new + r)), vc));
    const vf was_empty = simd::sub(old, simd::set1(-FLT_MAX));  // < 0 only where old = -inf
    simd::store(st.corr + r, simd::select_negative(was_empty, simd::zero(), keep));
  }
  for (int r = 0; r < rows; ++r) {  // pass 3: the weights, their sums, the rescaling
    const int valid = st.valid[r];
    if (valid <= 0) {
      clear(r);
      continue;
    }
    const float* x = s + r * stride;
    const vf vmx = simd::set1(st.m_new[r]), vmc = simd::set1(-st.m_new[r] * c);
    constexpr int parts = kSums / W;  // vectors of partial sums
    vf vsum[parts];
    for (int h = 0; h < parts; ++h) vsum[h] = simd::zero();
    for (int u = 0; u < n; ++u) {
      const vf v = simd::load(x + W * u);
      const vf e = COARSE ? simd::exp2<4>(simd::fmadd(v, vc, vmc))
                          : simd::exp2(simd::mul(simd::sub(v, vmx), vc));
      vf& sum = vsum[u % parts];
      sum = simd::add(sum, emit(r, u, simd::keep_first(e, valid - W * u)));
    }
    const vf corr = simd::set1(st.corr[r]);  // rescaled unconditionally: a branch on corr
    for (int h = 0; h < parts; ++h) {         // == 1 mispredicts about every other block
      float* l = st.l + r * kSums + W * h;
      simd::store(l, simd::fmadd(simd::load(l), corr, vsum[h]));
    }
    st.m[r] = st.m_new[r];
    for (int e = 0; e < d; e += W)
      simd::store(acc + r * d + e, simd::mul(simd::load(acc + r * d + e), corr));
  }
}

// Row r's sum of weights: its kSums partial sums p added up as ((p_i + p_i+8) over 8, then
// halves of 4, 2, 1), the same order on both widths.
inline float row_sum(const SoftmaxRows& st, int r) {
  const float* p = st.l + r * kSums;
  const __m256 s8 = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

}  // namespace varlen
#endif  // VLLM_SIMD_WIDTH
