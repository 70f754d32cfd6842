// out = (x @ W.T + bias) [+ or *] other, for a handful of rows (a short prompt, the pooled
// rows of a last layer), float32, reading the weight straight from oneDNN's packed copy.
//
// With few rows a projection is a stream of its weight: each weight element meets only M
// FMAs. oneDNN's GEMM for M <= 16 ran at 3-5 GB/s of weight here (MiniLM, 9 tokens: 10.7
// of 15 ms), far below what the memory gives (15.5 GB/s on 2 cores). This kernel streams
// the packed weight once with a software prefetch ahead and keeps every row's accumulators
// in registers: per k, two weight vectors meet MR broadcast x values.
//
// Weight layout (what `_reorder_linear_weight` gives for float32 on AVX2; Python checks it
// with a probe before using this kernel): blocks of NB output columns, each [Kp][NB] with
// the NB columns contiguous (`BA64b`), Kp >= K (zero rows past K), the last block padded.
// x: [M, K] (row stride x_row); other: [M, N] (row stride other_row) or null; out: [M, N]
// (row stride out_row). mode: 0 none, 1 add other, 2 multiply by other, then on x @ W.T +
// bias alone: 3 GELU (erf), 4 SiLU, 5 ReLU.
// A plain C entry point on raw pointers, called through ctypes by
// vllm/model_executor/layers/skinny_gemm.py.
#include "epilogue.h"
#include "simd.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#if VLLM_SIMD_WIDTH
namespace {

using simd::vf;
using simd::W;
using namespace epilogue;

constexpr int SW = 2 * W;             // output columns per micro-tile (two vectors)
constexpr int MR = W == 16 ? 12 : 6;  // rows per micro-tile: 2 * MR accumulators in registers
constexpr int AHEAD = 32;             // prefetch the weight row this many k ahead

struct Epilogue {
  const float* bias;   // [N] or null
  const float* other;  // [M, N] or null
  int64_t other_row;
  int mode;
};

// dst[0:cols] = epilogue(acc[0:cols] + bias[c0:c0+cols]) for one row of a micro-tile.
inline void finish(const float* acc, const Epilogue& ep, const float* other, int64_t c0,
                   int cols, float* dst) {
  if (cols == SW) {
    for (int u = 0; u < SW; u += W) {
      vf v = simd::load(acc + u);
      if (ep.bias) v = simd::add(v, simd::load(ep.bias + c0 + u));
      simd::store(dst + u, vector_epilogue(v, ep.mode, other ? other + u : nullptr));
    }
    return;
  }
  for (int c = 0; c < cols; ++c)
    dst[c] = scalar_epilogue(acc[c] + (ep.bias ? ep.bias[c0 + c] : 0.0f), ep.mode, other, c);
}

// out[0:ROWS][0:cols] = epilogue(x[0:ROWS] . w[:, 0:SW]); w: k rows of stride nb.
// PREFETCH: also pull the whole nb-wide weight row AHEAD rows on into L2 (done on the
// first pass over a block, so later passes find it there).
template <int ROWS, bool PREFETCH>
void tile(const float* x, int64_t x_row, const float* w, int64_t nb, int64_t k,
          const Epilogue& ep, int64_t c0, int cols, float* out, int64_t out_row) {
  vf a0[ROWS], a1[ROWS];
  // GCC keeps arrays of vectors in registers only when it unrolls these loops early.
  _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; ++r) a0[r] = a1[r] = simd::zero();
  for (int64_t e = 0; e < k; ++e) {
    if (PREFETCH) {
      const char* ahead = reinterpret_cast<const char*>(w + (e + AHEAD) * nb);
      for (int64_t b = 0; b < nb * 4; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T1);
    }
    const vf w0 = simd::load(w + e * nb), w1 = simd::load(w + e * nb + W);
    _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; ++r) {
      const vf xv = simd::set1(x[r * x_row + e]);
      a0[r] = simd::fmadd(xv, w0, a0[r]);
      a1[r] = simd::fmadd(xv, w1, a1[r]);
    }
  }
  float acc[ROWS * SW];
  _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; ++r) {
    simd::store(acc + r * SW, a0[r]);
    simd::store(acc + r * SW + W, a1[r]);
  }
  for (int r = 0; r < ROWS; ++r)
    finish(acc + r * SW, ep, ep.other ? ep.other + r * ep.other_row + c0 : nullptr, c0, cols,
           out + r * out_row + c0);
}

template <int ROWS>
void tile_rows(bool prefetch, const float* x, int64_t x_row, const float* w, int64_t nb,
               int64_t k, const Epilogue& ep, int64_t c0, int cols, float* out,
               int64_t out_row) {
  if (prefetch)
    tile<ROWS, true>(x, x_row, w, nb, k, ep, c0, cols, out, out_row);
  else
    tile<ROWS, false>(x, x_row, w, nb, k, ep, c0, cols, out, out_row);
}

// One micro-tile of `rows` (1..MR) rows, dispatched to its compile-time row count.
template <int ROWS = MR>
void tile_any(int rows, bool prefetch, const float* x, int64_t x_row, const float* w,
              int64_t nb, int64_t k, const Epilogue& ep, int64_t c0, int cols, float* out,
              int64_t out_row) {
  if constexpr (ROWS > 1) {
    if (rows < ROWS)
      return tile_any<ROWS - 1>(rows, prefetch, x, x_row, w, nb, k, ep, c0, cols, out, out_row);
  }
  tile_rows<ROWS>(prefetch, x, x_row, w, nb, k, ep, c0, cols, out, out_row);
}

}  // namespace
#endif  // VLLM_SIMD_WIDTH

extern "C" {

// The output columns per micro-tile: the packed block width must be a multiple of it.
int vllm_skinny_gemm_tile_width() { return VLLM_SIMD_WIDTH * 2; }

// Returns 0, or 1 (no SIMD build, or a block width the tiles do not divide).
int vllm_skinny_gemm(const float* x, int64_t m, int64_t k, int64_t x_row, const float* w,
                     int64_t n, int64_t kp, int64_t nb, const float* bias, const float* other,
                     int64_t other_row, int mode, float* out, int64_t out_row, int threads) {
#if !VLLM_SIMD_WIDTH
  return 1;
#else
  if (nb <= 0 || nb % SW || kp < k) return 1;
  const int64_t blocks = (n + nb - 1) / nb, per_block = nb / SW;
#pragma omp parallel for num_threads(std::max(threads, 1)) schedule(static)
  for (int64_t t = 0; t < blocks * per_block; ++t) {
    const int64_t block = t / per_block, part = t % per_block;
    const int64_t c0 = block * nb + part * SW;
    if (c0 >= n) continue;
    const int cols = (int)std::min<int64_t>(SW, n - c0);
    const float* wt = w + block * kp * nb + part * SW;
    for (int64_t m0 = 0; m0 < m; m0 += MR) {
      const int rows = (int)std::min<int64_t>(MR, m - m0);
      const Epilogue rows_ep{bias, other ? other + m0 * other_row : nullptr, other_row, mode};
      tile_any(rows, part == 0 && m0 == 0, x + m0 * x_row, x_row, wt, nb, k, rows_ep, c0,
               cols, out + m0 * out_row, out_row);
    }
  }
  return 0;
#endif
}

}  // extern "C"
