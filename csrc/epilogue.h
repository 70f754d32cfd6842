// The element-wise epilogues the projection kernels apply after x @ W.T + bias
// (skinny_gemm.cpp, int8_linear.cpp): 0 none, 1 add other, 2 multiply by other,
// 3 GELU (erf), 4 SiLU, 5 ReLU, 6 GELU for values rounded to int8 next (simd::gelu_q: the
// int8 projections' GELU). Vector and scalar forms give the same values to rounding
// (GELU_Q: the same values).
#pragma once

#include "simd.h"

#include <algorithm>
#include <cmath>

#if VLLM_SIMD_WIDTH
namespace epilogue {

using simd::vf;

enum Mode { NONE = 0, ADD = 1, MUL = 2, GELU = 3, SILU = 4, RELU = 5, GELU_Q = 6 };

// simd::gelu_q's operations on one float.
inline float scalar_gelu_q(float v) {
  const float z = std::max(std::min(v * 0.70710678118654752f, 3.0f), -3.0f);
  const float s = std::fma(z * z, 2.0f / 9.0f, -1.0f);
  float p = simd::kGeluQ[8];
  for (int i = 7; i >= 0; --i) p = std::fma(p, s, simd::kGeluQ[i]);
  const float half_x = v * 0.5f;
  return std::fma(half_x, z * p, half_x);
}

inline float scalar_epilogue(float v, int mode, const float* other, int c) {
  switch (mode) {
    case ADD: return v + other[c];
    case MUL: return v * other[c];
    case GELU: return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
    case SILU: return v / (1.0f + std::exp(-v));
    case RELU: return std::max(v, 0.0f);
    case GELU_Q: return scalar_gelu_q(v);
    default: return v;
  }
}

inline vf vector_epilogue(vf v, int mode, const float* other) {
  switch (mode) {
    case ADD: return simd::add(v, simd::load(other));
    case MUL: return simd::mul(v, simd::load(other));
    case GELU: return simd::gelu(v);
    case SILU: return simd::silu(v);
    case RELU: return simd::max(v, simd::zero());
    case GELU_Q: return simd::gelu_q(v);
    default: return v;
  }
}

}  // namespace epilogue
#endif
