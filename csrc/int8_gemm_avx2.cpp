// The int8 GEMM of `quantization="int8"` on CPUs without int8 dot products (AVX2 only: no
// AVX512-VNNI, AVX-VNNI or AMX-INT8), where oneDNN's own int8 GEMM saturates:
//
//   acc[m, n] = sum_k a[m, k] * w[n, k]    (a, w int8 in [-127, 127]; int32, exact)
//   out[m, n] = epilogue(acc[m, n] * row_scale[m] * col_scale[n] + bias[n])   (float32)
//
// AVX2 has no s8 x s8 dot product. Both operands are widened to int16 and multiplied with
// vpmaddwd, which adds each pair of products into int32 (|a w + a' w'| <= 2 * 128 * 128,
// no saturation): every sum is the exact integer the VNNI / AMX path computes, and the
// dequantized outputs are the same. (The first version used vpmaddubsw on |a| x sign(a) w:
// 32 products per instruction, but vpsignb + vpmaddubsw + vpmaddwd are three multiply-pipe
// ops per 32 products; on Zen 4 a loop of them ran 73 products/ns against vpmaddwd's 93, and
// this kernel 1.2x the old one, benchmarks/README.md "Session 22".)
//
// Layout of the packed weight (made by layers/int8_weights.py `pack_avx2(group=2)`): blocks
// of 16 output columns, each [ceil(K / 2)][16][2] bytes (a pair of k of 16 columns: 32
// bytes, widened in the loop to two ymm of 8 columns), columns past N and k past K zero:
// int8 in memory, a quarter of the float32 weight. A register tile is 6 rows x 16 columns
// (12 ymm accumulators); a row's pair of int16 activations is broadcast to all 8 lanes
// (tiles of 1-5 rows where M leaves them). A task (int8_gemm_common.h `run_tasks`, the
// VNNI and AMX kernels' float end) widens its rows (up to 48) into zero-padded int16 rows,
// makes their int32 sums in a per-thread buffer, then turns each row back to float
// (int8_dequantize.h: the same floats as the separate pass after oneDNN's GEMM) and, where
// asked, layer-norms and quantizes it for the next projection while it is in L1: no int32
// [M, N] goes through memory, and an MLP's hidden rows need not either.
#include "int8_gemm_common.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using int8_gemm::kBlock;
constexpr int kTileRows = 6;        // rows per register tile
constexpr int64_t kPanelRows = 48;  // rows one task covers (their int16 copy stays in L2)

#if defined(__AVX2__) && VLLM_SIMD_WIDTH
// A row's activations k, k + 1 (int16) in every 32-bit lane.
inline __m256i broadcast_pair(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// 16 columns' weights of one pair of k (32 int8) as two ymm of int16, 8 columns each.
inline void widen_pair(const int8_t* p, __m256i& w0, __m256i& w1) {
  w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
}

// acc0/acc1 (columns 0-7 / 8-15) += a[k] w[k] + a[k+1] w[k+1] for one row's pair.
inline void row_pair(__m256i& acc0, __m256i& acc1, const int16_t* a, __m256i w0,
                     __m256i w1) {
  const __m256i s = broadcast_pair(a);
  acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(s, w0));
  acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(s, w1));
}

// R (1..6) rows (int16, stride kp) x one block of 16 columns: their int32 sums to sums (row
// stride ld). Named accumulators, not an array: GCC then keeps all 12 in registers.
template <int R>
void tile(const int16_t* a, int64_t kp, const int8_t* wb, int32_t* sums, int64_t ld) {
  __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
          c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#pragma GCC unroll 2
  for (int64_t g = 0; g < kp; g += 2) {
    __m256i w0, w1;
    widen_pair(wb + g * 16, w0, w1);
    row_pair(c00, c01, a + g, w0, w1);
    if constexpr (R > 1) row_pair(c10, c11, a + kp + g, w0, w1);
    if constexpr (R > 2) row_pair(c20, c21, a + 2 * kp + g, w0, w1);
    if constexpr (R > 3) row_pair(c30, c31, a + 3 * kp + g, w0, w1);
    if constexpr (R > 4) row_pair(c40, c41, a + 4 * kp + g, w0, w1);
    if constexpr (R > 5) row_pair(c50, c51, a + 5 * kp + g, w0, w1);
  }
  const __m256i acc[6][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                             {c30, c31}, {c40, c41}, {c50, c51}};
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + r * ld), acc[r][0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + r * ld + 8), acc[r][1]);
  }
}

void rows_tile(int rows, const int16_t* a, int64_t kp, const int8_t* wb, int32_t* sums,
               int64_t ld) {
  switch (rows) {
    case 6: return tile<6>(a, kp, wb, sums, ld);
    case 5: return tile<5>(a, kp, wb, sums, ld);
    case 4: return tile<4>(a, kp, wb, sums, ld);
    case 3: return tile<3>(a, kp, wb, sums, ld);
    case 2: return tile<2>(a, kp, wb, sums, ld);
    default: return tile<1>(a, kp, wb, sums, ld);
  }
}

// a [rows, k] (row stride a_row) widened to int16 into zero-padded rows of kp.
void widen_rows(const int8_t* a, int64_t rows, int64_t k, int64_t a_row, int64_t kp,
                int16_t* wide) {
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* src = a + r * a_row;
    int16_t* dst = wide + r * kp;
    int64_t c = 0;
    for (; c + 16 <= k; c += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c), _mm256_cvtepi8_epi16(v));
    }
    for (; c < k; ++c) dst[c] = src[c];
    for (; c < kp; ++c) dst[c] = 0;
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

// k per packed group of a column in this kernel's weight (2; the VNNI / AMX kernels' 4).
int vllm_int8_gemm_avx2_group() { return 2; }

// out [m, n] float32 (row stride n) = epilogue(a [m, k] int8 (row stride a_row) x the packed
// weight of n columns (see the top)), dequantized as int8_dequantize.h with row_scales [m],
// col_scales [n], bias [n] or null, other [m, n] (row stride other_row, modes 1, 2) or null;
// norm_w / norm_b / eps, bf16_out, q_out / q_scales as vllm_int8_gemm_vnni's (each row
// layer-normed, rounded to bf16, or quantized for the next projection in the same pass;
// out may then be null). Returns 0; 1 where the build has no AVX2; 3 where bf16_out is
// asked of a build without AVX512-BF16.
int vllm_int8_gemm_avx2_fused(const int8_t* a, int64_t m, int64_t k, int64_t a_row,
                              const int8_t* w_packed, int64_t n, const float* row_scales,
                              const float* col_scales, const float* bias, const float* other,
                              int64_t other_row, int mode, const float* norm_w,
                              const float* norm_b, float eps, uint16_t* bf16_out, float* out,
                              int8_t* q_out, float* q_scales, int threads) {
#if !(defined(__AVX2__) && VLLM_SIMD_WIDTH)
  return 1;
#else
  if (bf16_out && !VLLM_INT8_BF16_OUT) return 3;
  threads = std::max(threads, 1);
  const int8_gemm::Dequantize dq{row_scales, col_scales, bias, other, other_row, mode,
                                  norm_w, norm_b, eps, bf16_out};
  const int64_t kp = (k + 1) / 2 * 2;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const auto rows = gemm_tasks::RowSplit::balanced(m, kPanelRows, kTileRows, threads);
  const int64_t per_task = gemm_tasks::blocks_per_task(rows.count, blocks, 1, threads);
  int8_gemm::run_tasks(rows, n, per_task, threads, dq, out, q_out, q_scales,
                       [&](int64_t r0, int64_t r1, int64_t b0, int64_t b1, int64_t& ld) {
    // the task's rows widened and its int32 sums: per-thread buffers in L2, reused
    thread_local std::vector<int16_t> wide;
    thread_local std::vector<int32_t> sums;
    wide.resize(kPanelRows * kp);
    sums.resize(kPanelRows * per_task * kBlock);
    widen_rows(a + r0 * a_row, r1 - r0, k, a_row, kp, wide.data());
    ld = (b1 - b0) * kBlock;
    for (int64_t b = b0; b < b1; ++b) {  // the block's weights stay in L1 over the rows
      for (int64_t r = r0; r < r1; r += kTileRows)
        rows_tile((int)std::min<int64_t>(kTileRows, r1 - r), wide.data() + (r - r0) * kp, kp,
                  w_packed + b * kp * kBlock, sums.data() + (r - r0) * ld + (b - b0) * kBlock,
                  ld);
    }
    return sums.data();
  });
  return 0;
#endif
}

// vllm_int8_gemm_avx2_fused with floats only (the entry point before the fused end).
int vllm_int8_gemm_avx2(const int8_t* a, int64_t m, int64_t k, int64_t a_row,
                        const int8_t* w_packed, int64_t n, const float* row_scales,
                        const float* col_scales, const float* bias, const float* other,
                        int64_t other_row, int mode, float* out, int threads) {
  return vllm_int8_gemm_avx2_fused(a, m, k, a_row, w_packed, n, row_scales, col_scales, bias,
                                   other, other_row, mode, nullptr, nullptr, 0.0f, nullptr,
                                   out, nullptr, nullptr, threads);
}

}  // extern "C"
