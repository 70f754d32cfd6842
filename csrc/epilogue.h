// The element-wise epilogues the projection kernels apply after x @ W.T + bias
// (skinny_gemm.cpp, int8_linear.cpp): 0 none, 1 add other, 2 multiply by other,
// 3 GELU (erf), 4 SiLU, 5 ReLU. Vector and scalar forms give the same values to rounding.
#pragma once

#include "simd.h"

#include <algorithm>
#include <cmath>

#if VLLM_SIMD_WIDTH
namespace epilogue {

using simd::vf;

enum Mode { NONE = 0, ADD = 1, MUL = 2, GELU = 3, SILU = 4, RELU = 5 };

inline float scalar_epilogue(float v, int mode, const float* other, int c) {
  switch (mode) {
    case ADD: return v + other[c];
    case MUL: return v * other[c];
    case GELU: return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
    case SILU: return v / (1.0f + std::exp(-v));
    case RELU: return std::max(v, 0.0f);
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
    default: return v;
  }
}

}  // namespace epilogue
#endif
