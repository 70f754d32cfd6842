// The float vector the attention kernel is written in, chosen at compile time:
// 16 lanes on AVX-512, 8 on AVX2 + FMA. VLLM_SIMD_WIDTH is 0 where neither is enabled
// (the attention kernel is then not compiled; RMSNorm is plain C++ and always is).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <limits>

#if defined(__AVX512F__)
#define VLLM_SIMD_WIDTH 16
#define VLLM_SIMD_NAME "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#define VLLM_SIMD_WIDTH 8
#define VLLM_SIMD_NAME "avx2"
#else
#define VLLM_SIMD_WIDTH 0
#define VLLM_SIMD_NAME "none"
#endif

namespace simd {

#if VLLM_SIMD_WIDTH == 16
constexpr int W = 16;
using vf = __m512;
inline vf load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf set1(float x) { return _mm512_set1_ps(x); }
inline vf zero() { return _mm512_setzero_ps(); }
inline vf fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
inline vf add(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf max(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf min(vf a, vf b) { return _mm512_min_ps(a, b); }
inline float reduce_max(vf v) { return _mm512_reduce_max_ps(v); }
inline float reduce_add(vf v) { return _mm512_reduce_add_ps(v); }
inline vf round(vf v) {
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline vf pow2n(vf p, vf n) { return _mm512_scalef_ps(p, n); }  // p * 2^n
inline vf div(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf abs(vf v) { return _mm512_abs_ps(v); }
inline vf copysign(vf mag, vf sign) {  // |mag| with sign's sign bit
  const __m512i s = _mm512_set1_epi32(0x80000000);
  return _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_andnot_si512(s, _mm512_castps_si512(mag)),
      _mm512_and_si512(s, _mm512_castps_si512(sign))));
}
inline vf select_negative(vf x, vf if_neg, vf if_not) {  // x < 0 ? if_neg : if_not
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero(), _CMP_LT_OQ), if_not, if_neg);
}
inline __mmask16 first(int n) {
  return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}
// int32 lanes as floats; v rounded (current mode: nearest even) to int8, saturating.
inline vf load_i32(const int32_t* p) {
  return _mm512_cvtepi32_ps(_mm512_loadu_si512(reinterpret_cast<const void*>(p)));
}
inline void store_i8(int8_t* p, vf v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
}
// The first n lanes of p, `fill` in the others.
inline vf load_first(const float* p, int n, float fill) {
  return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), first(n), p);
}
// v in the first n lanes, 0 in the others.
inline vf keep_first(vf v, int n) { return _mm512_maskz_mov_ps(first(n), v); }
inline vf unpacklo(vf a, vf b) { return _mm512_unpacklo_ps(a, b); }
inline vf unpackhi(vf a, vf b) { return _mm512_unpackhi_ps(a, b); }
template <int IMM>
inline vf shuffle(vf a, vf b) { return _mm512_shuffle_ps(a, b, IMM); }
inline void transpose_in_lanes(vf* r);  // below, shared by both widths
// r[0..15] (16 rows of 16) becomes its transpose.
inline void transpose(vf* r) {
  transpose_in_lanes(r);
  vf u[16];
  for (int k = 0; k < 4; ++k) {  // the 4 x 4 transpose of 128-bit lanes
    const vf v0 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88);
    const vf v1 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xDD);
    const vf v2 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88);
    const vf v3 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xDD);
    u[k] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    u[8 + k] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    u[4 + k] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    u[12 + k] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = u[i];
}
#elif VLLM_SIMD_WIDTH == 8
constexpr int W = 8;
using vf = __m256;
inline vf load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf set1(float x) { return _mm256_set1_ps(x); }
inline vf zero() { return _mm256_setzero_ps(); }
inline vf fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
inline vf add(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf max(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf min(vf a, vf b) { return _mm256_min_ps(a, b); }
inline float reduce_max(vf v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline float reduce_add(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline vf round(vf v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vf pow2n(vf p, vf n) {  // p * 2^n for integral n in [-126, 127]
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                       _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline vf div(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf abs(vf v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
inline vf copysign(vf mag, vf sign) {  // |mag| with sign's sign bit
  const vf s = _mm256_set1_ps(-0.0f);
  return _mm256_or_ps(_mm256_andnot_ps(s, mag), _mm256_and_ps(s, sign));
}
inline vf select_negative(vf x, vf if_neg, vf if_not) {  // x < 0 ? if_neg : if_not
  return _mm256_blendv_ps(if_not, if_neg, _mm256_cmp_ps(x, zero(), _CMP_LT_OQ));
}
inline vf load_i32(const int32_t* p) {
  return _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void store_i8(int8_t* p, vf v) {
  const __m256i i = _mm256_cvtps_epi32(v);
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(w, w));
}
inline vf lanes_below(int n) {  // all-ones in lanes < n
  return _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_ps((float)n),
                       _CMP_LT_OQ);
}
inline vf load_first(const float* p, int n, float fill) {
  if (n >= 8) return load(p);
  if (n <= 0) return set1(fill);
  const vf m = lanes_below(n);
  return _mm256_blendv_ps(set1(fill), _mm256_maskload_ps(p, _mm256_castps_si256(m)), m);
}
inline vf keep_first(vf v, int n) {
  return n >= 8 ? v : n <= 0 ? zero() : _mm256_and_ps(v, lanes_below(n));
}
template <int IMM>
inline vf shuffle(vf a, vf b) { return _mm256_shuffle_ps(a, b, IMM); }
inline vf unpacklo(vf a, vf b) { return _mm256_unpacklo_ps(a, b); }
inline vf unpackhi(vf a, vf b) { return _mm256_unpackhi_ps(a, b); }
inline void transpose_in_lanes(vf* r);  // below, shared by both widths
inline void transpose(vf* r) {  // r[0..7] (8 rows of 8) becomes its transpose
  transpose_in_lanes(r);
  vf u[8];
  for (int k = 0; k < 4; ++k) {
    u[k] = _mm256_permute2f128_ps(r[k], r[4 + k], 0x20);
    u[4 + k] = _mm256_permute2f128_ps(r[k], r[4 + k], 0x31);
  }
  for (int i = 0; i < 8; ++i) r[i] = u[i];
}
#endif

#if VLLM_SIMD_WIDTH
// The in-lane half of a transpose (both widths): for each group of four vectors
// r[i .. i + 3], r[i + k] becomes, in 128-bit lane L, element 4L + k of the four.
inline void transpose_in_lanes(vf* r) {
  for (int i = 0; i < W; i += 4) {
    const vf t0 = unpacklo(r[i], r[i + 1]), t1 = unpackhi(r[i], r[i + 1]);
    const vf t2 = unpacklo(r[i + 2], r[i + 3]), t3 = unpackhi(r[i + 2], r[i + 3]);
    r[i] = shuffle<0x44>(t0, t2);
    r[i + 1] = shuffle<0xEE>(t0, t2);
    r[i + 2] = shuffle<0x44>(t1, t3);
    r[i + 3] = shuffle<0xEE>(t1, t3);
  }
}

// Makes the compiler hold v in a register here: without it GCC folds a loaded vector into
// every FMA that uses it as a memory operand (one load per use), so a micro-tile that
// reuses a vector across rows becomes bound by the load ports rather than the FMAs.
template <class V>
inline void in_register(V& v) { asm volatile("" : "+v"(v)); }

// e^x = 2^n * e^r, n = round(x / ln2), |r| <= ln2 / 2; degree-6 Taylor for e^r. For x <= 0.
inline vf exp(vf x) {
  x = max(x, set1(-87.0f));
  const vf n = round(mul(x, set1(1.44269504088896341f)));
  vf r = fnmadd(n, set1(0.693359375f), x);
  r = fnmadd(n, set1(-2.12194440e-4f), r);
  vf p = set1(1.0f / 720);
  p = fmadd(p, r, set1(1.0f / 120));
  p = fmadd(p, r, set1(1.0f / 24));
  p = fmadd(p, r, set1(1.0f / 6));
  p = fmadd(p, r, set1(0.5f));
  p = fmadd(p, r, set1(1.0f));
  p = fmadd(p, r, set1(1.0f));
  return pow2n(p, n);
}

// 2^x for x <= 0 (x below -126 gives 2^-126): 2^n * 2^r, n = round(x), |r| <= 1/2, 2^r a
// polynomial fitted for least maximum relative error on [-1/2, 1/2]: degree 6 is as exact
// as float32 evaluation allows (1.0e-7); degree 4 (2.7e-6) is for values rounded to
// bfloat16 next (2^-9), where it moves one rounding in ~700 by one bf16 step.
template <int DEG = 6>
inline vf exp2(vf x) {
  static_assert(DEG == 4 || DEG == 6, "exp2: degree 4 or 6");
  x = max(x, set1(-126.0f));
  const vf n = round(x);
  const vf r = sub(x, n);
  vf p;
  if (DEG == 6) {
    p = fmadd(set1(1.534579205e-4f), r, set1(1.339992974e-3f));
    p = fmadd(p, r, set1(9.618489072e-3f));
    p = fmadd(p, r, set1(5.550328642e-2f));
    p = fmadd(p, r, set1(2.402264625e-1f));
    p = fmadd(p, r, set1(6.931471825e-1f));
    p = fmadd(p, r, set1(1.0f));
  } else {
    p = fmadd(set1(9.570068680e-3f), r, set1(5.591780692e-2f));
    p = fmadd(p, r, set1(2.402474433e-1f));
    p = fmadd(p, r, set1(6.931218505e-1f));
    p = fmadd(p, r, set1(9.999992847e-1f));
  }
  return pow2n(p, n);
}

// erf(x): Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7).
inline vf erf(vf x) {
  const vf ax = abs(x);
  const vf t = div(set1(1.0f), fmadd(set1(0.3275911f), ax, set1(1.0f)));
  vf p = set1(1.061405429f);
  p = fmadd(p, t, set1(-1.453152027f));
  p = fmadd(p, t, set1(1.421413741f));
  p = fmadd(p, t, set1(-0.284496736f));
  p = fmadd(p, t, set1(0.254829592f));
  p = mul(p, t);
  return copysign(fnmadd(p, exp(mul(sub(zero(), ax), ax)), set1(1.0f)), x);
}

// GELU as torch's default (erf form): x / 2 * (1 + erf(x / sqrt 2)).
inline vf gelu(vf x) {
  const vf half_x = mul(x, set1(0.5f));
  return fmadd(half_x, erf(mul(x, set1(0.70710678118654752f))), half_x);
}

// GELU for values rounded to int8 next (an int8 model's MLP hidden rows, whose
// quantization step is max|row| / 127): erf(z) = z P(2 z^2 / 9 - 1) on z clamped to [-3, 3]
// (P in a variable on [-1, 1], so its terms do not cancel), P of degree 8 fitted for least
// maximum error; 16 operations instead of gelu's ~27 with a divide and an exp, at most
// 3.6e-5 off for |x| <= 12 (2.7e-6 |x| beyond). The scalar form (epilogue.h) runs the same
// operations, so both give the same floats.
constexpr float kGeluQ[9] = {0.47012871503829956f, -0.22872856259346008f,
                             0.15759818255901337f, -0.1111425831913948f,
                             0.07214697450399399f, -0.03973197191953659f,
                             0.024074608460068703f, -0.01786532998085022f,
                             0.006851510610431433f};
inline vf gelu_q(vf x) {
  const vf z = max(min(mul(x, set1(0.70710678118654752f)), set1(3.0f)), set1(-3.0f));
  const vf s = fmadd(mul(z, z), set1(2.0f / 9.0f), set1(-1.0f));
  vf p = set1(kGeluQ[8]);
  for (int i = 7; i >= 0; --i) p = fmadd(p, s, set1(kGeluQ[i]));
  const vf half_x = mul(x, set1(0.5f));
  return fmadd(half_x, mul(z, p), half_x);
}

// SiLU: x / (1 + e^-x), from e^-|x| so exp only meets x <= 0.
inline vf silu(vf x) {
  const vf e = exp(sub(zero(), abs(x)));
  const vf r = div(set1(1.0f), add(set1(1.0f), e));  // sigmoid(|x|)
  return mul(x, select_negative(x, mul(e, r), r));
}
#endif

}  // namespace simd
