// The int8 GEMM of `quantization="int8"` on CPUs without int8 dot products (AVX2 only: no
// AVX512-VNNI, AVX-VNNI or AMX-INT8), where oneDNN's own int8 GEMM saturates:
//
//   acc[m, n] = sum_k a[m, k] * w[n, k]    (a, w int8 in [-127, 127]; int32, exact)
//   out[m, n] = epilogue(acc[m, n] * row_scale[m] * col_scale[n] + bias[n])   (float32)
//
// AVX2 has no s8 x s8 dot product; vpmaddubsw multiplies u8 by s8 and adds each pair of
// products into int16 WITH SATURATION, so the usual a + 128 shift (u8 up to 255) can lose
// up to 64770 - 32767 per pair. Here the unsigned operand is |a| (<= 128) and the sign of
// a moves onto the weight (vpsignb: w, -w or 0), so a pair is at most 2 * 128 * 127 =
// 32512 < 32767 and never saturates: |a| * sign(a) w = a * w exactly. vpmaddwd against
// ones then adds the pairs into int32 (4 products per lane), so every sum is the exact
// integer the VNNI / AMX path computes, and the dequantized outputs are the same.
// Weights must lie in [-127, 127] (vpsignb cannot negate -128); quantize_weight clamps.
//
// Layout of the packed weight (made by layers/int8_linear.py `pack_avx2`): blocks of 16
// output columns, each [ceil(K / 4)][16][4] bytes (a group of 4 k of 16 columns: 64
// bytes, two ymm of 8 columns), columns past N and k past K zero. A register tile is 4
// rows x 16 columns (8 ymm accumulators); a row's 4 bytes of a group are broadcast to all
// 8 lanes (tiles of 1-3 rows where M leaves them). Activations are copied once per call
// into zero-padded rows of a and |a|. Each tile row's 16 sums go back to float from a
// stack buffer (int8_dequantize.h: the same floats as the separate pass after oneDNN's
// GEMM), so no int32 [M, N] goes through memory.
#include "int8_gemm_common.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using int8_gemm::kBlock;
constexpr int kTileRows = 4;        // rows per register tile
constexpr int64_t kPanelRows = 64;  // rows one task covers (its a and |a| stay in L2)
constexpr int64_t kPanelBlocks = 4;  // blocks one task covers

#if defined(__AVX2__) && VLLM_SIMD_WIDTH
using int8_gemm::Dequantize;

inline __m256i broadcast_group(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// acc += a * w for one 4-byte group: |a| (u8) x sign(a) w (s8), pairs in int16, then int32.
inline __m256i dot_group(__m256i acc, __m256i abs_a, __m256i a, __m256i w, __m256i ones) {
  const __m256i pairs = _mm256_maddubs_epi16(abs_a, _mm256_sign_epi8(w, a));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
}

// One row's group against the block's two weight vectors.
inline void row_group(__m256i& acc0, __m256i& acc1, const int8_t* a, const int8_t* abs_a,
                      __m256i w0, __m256i w1, __m256i ones) {
  const __m256i s = broadcast_group(a), u = broadcast_group(abs_a);
  acc0 = dot_group(acc0, u, s, w0, ones);
  acc1 = dot_group(acc1, u, s, w1, ones);
}

// R (1..4) rows from row r0 (stride kp) x the block of 16 columns from column c0, `cols`
// of them written, dequantized, to out (row stride ldc). Named accumulators, not an
// array: GCC then keeps all 8 in registers.
template <int R>
void tile(const int8_t* a, const int8_t* abs_a, int64_t kp, const int8_t* wb, int64_t r0,
          int64_t c0, int cols, const Dequantize& dq, float* out, int64_t ldc) {
  __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
          c21 = c00, c30 = c00, c31 = c00;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < kp; g += 4) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + g * 16));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + g * 16 + 32));
    row_group(c00, c01, a + g, abs_a + g, w0, w1, ones);
    if constexpr (R > 1) row_group(c10, c11, a + kp + g, abs_a + kp + g, w0, w1, ones);
    if constexpr (R > 2) row_group(c20, c21, a + 2 * kp + g, abs_a + 2 * kp + g, w0, w1, ones);
    if constexpr (R > 3) row_group(c30, c31, a + 3 * kp + g, abs_a + 3 * kp + g, w0, w1, ones);
  }
  const __m256i acc[4][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}};
  for (int r = 0; r < R; ++r) {
    alignas(32) int32_t row[kBlock];
    _mm256_store_si256(reinterpret_cast<__m256i*>(row), acc[r][0]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(row + 8), acc[r][1]);
    int8_gemm::store_row(row, r0 + r, c0, cols, dq, out, ldc);
  }
}

void rows_tile(int rows, const int8_t* a, const int8_t* abs_a, int64_t kp, const int8_t* wb,
               int64_t r0, int64_t c0, int cols, const Dequantize& dq, float* out,
               int64_t ldc) {
  switch (rows) {
    case 4: return tile<4>(a, abs_a, kp, wb, r0, c0, cols, dq, out, ldc);
    case 3: return tile<3>(a, abs_a, kp, wb, r0, c0, cols, dq, out, ldc);
    case 2: return tile<2>(a, abs_a, kp, wb, r0, c0, cols, dq, out, ldc);
    default: return tile<1>(a, abs_a, kp, wb, r0, c0, cols, dq, out, ldc);
  }
}

// a [m, k] (row stride a_row) into zero-padded rows of kp: sa = a, ua = |a| (as u8).
void pad_rows(const int8_t* a, int64_t m, int64_t k, int64_t a_row, int64_t kp, int8_t* sa,
              int8_t* ua, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < m; ++r) {
    const int8_t* src = a + r * a_row;
    int8_t* s = sa + r * kp;
    int8_t* u = ua + r * kp;
    int64_t c = 0;
    for (; c + 32 <= k; c += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(s + c), v);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + c), _mm256_abs_epi8(v));
    }
    for (; c < k; ++c) {
      s[c] = src[c];
      u[c] = (int8_t)(uint8_t)(src[c] < 0 ? -(int)src[c] : src[c]);
    }
    for (; c < kp; ++c) s[c] = u[c] = 0;
  }
}
#endif

}  // namespace

extern "C" {

// 1 where this build has the AVX2 int8 GEMM (any SIMD build for a CPU with AVX2), else 0.
int vllm_int8_gemm_avx2_built() {
#if defined(__AVX2__) && VLLM_SIMD_WIDTH
  return 1;
#else
  return 0;
#endif
}

int vllm_int8_gemm_avx2_block() { return kBlock; }

// out [m, n] float32 (row stride n) = epilogue(a [m, k] int8 (row stride a_row) x the packed
// weight of n columns (see the top), dequantized as int8_dequantize.h with row_scales [m],
// col_scales [n], bias [n] or null, other [m, n] (row stride other_row, modes 1, 2) or null.
// Returns 0, or 1 where the build has no AVX2.
int vllm_int8_gemm_avx2(const int8_t* a, int64_t m, int64_t k, int64_t a_row,
                        const int8_t* w_packed, int64_t n, const float* row_scales,
                        const float* col_scales, const float* bias, const float* other,
                        int64_t other_row, int mode, float* out, int threads) {
#if !(defined(__AVX2__) && VLLM_SIMD_WIDTH)
  return 1;
#else
  threads = std::max(threads, 1);
  const Dequantize dq{row_scales, col_scales, bias, other, other_row, mode};
  const int64_t kp = (k + 3) / 4 * 4;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<int8_t> padded(2 * m * kp);
  int8_t* sa = padded.data();
  int8_t* ua = sa + m * kp;
  pad_rows(a, m, k, a_row, kp, sa, ua, threads);
  int8_gemm::for_each_panel(m, blocks, kPanelRows, kPanelBlocks, threads,
                            [&](int64_t r0, int64_t r1, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {  // the block's weights stay in L1 over the rows
      const int8_t* wb = w_packed + b * kp * kBlock;
      const int cols = (int)std::min<int64_t>(kBlock, n - b * kBlock);
      for (int64_t r = r0; r < r1; r += kTileRows) {
        const int rows = (int)std::min<int64_t>(kTileRows, r1 - r);
        rows_tile(rows, sa + r * kp, ua + r * kp, kp, wb, r, b * kBlock, cols, dq, out, n);
      }
    }
  });
  return 0;
#endif
}

}  // extern "C"
