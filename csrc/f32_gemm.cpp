// A float32 GEMM with the projections' epilogues in its last pass, for CPUs where oneDNN's
// GEMM falls short of the FMA peak (AVX2-only CPUs, layers/f32_gemm.py):
//
//   out[m, n] = epilogue(sum_k a[m, k] * w[n, k] + bias[n])   then, optionally, LayerNorm
//
// epilogue.h's modes (add or multiply another [M, N] tensor, GELU, SiLU, ReLU). Under
// ONEDNN_MAX_CPU_ISA=AVX2 (Zen 4) oneDNN ran MiniLM's projections at 82% of the FMA peak
// inside the engine, its bias / GELU / residual epilogues costing about a sixth of that
// (benchmarks/README.md "Session 22"); this kernel applies them to each register tile
// before it is stored.
//
// Packed weight (layers/f32_gemm.py `pack`): blocks of NB = 2 W output columns (16 on
// AVX2, 32 on AVX-512), each [K][NB] with its columns contiguous, columns past N zero --
// the layout csrc/skinny_gemm.cpp reads (kp = K, nb = NB), so few-row calls use the same
// copy. A register tile is MR rows x NB columns (6 x 16 on AVX2: 12 ymm accumulators; a
// row's a[k] is broadcast from memory, two weight vectors loaded per k). K runs in passes
// of KC, so a block's KC x NB weights (24 KB) stay in L1 while a task's row tiles go over
// them, and its rows' KC-long spans stay in L2. Passes before the last add into the output
// (or, for a last block narrower than NB, a per-thread scratch); the last adds bias, applies
// the epilogue and stores. Tasks: gemm_tasks.h, as the int8 kernels.
#include "epilogue.h"
#include "gemm_tasks.h"
#include "int8_dequantize.h"
#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#if VLLM_SIMD_WIDTH
namespace {

using simd::vf;
using simd::W;

constexpr int NB = 2 * W;                    // columns per packed block and register tile
constexpr int MR = W == 16 ? 12 : 6;         // rows per register tile
constexpr int64_t KC = W == 16 ? 192 : 384;  // k per pass: a block's KC x NB floats, 24 KB
constexpr int64_t kPanelRows = 96;           // rows per task
// blocks per task at most (1024 columns): its sums between passes stay in L2 (Qwen3-0.6B's
// N = 3072 / 4096 ran 1.04-1.09x faster so)
constexpr int64_t kTaskBlocks = 1024 / NB;

// What the last pass does with the output from its first row and column: + bias, the
// epilogue (`other`: the [M, N] operand from the same place, row stride other_row), stored
// at out (row stride out_row), of which `cols` columns exist.
struct Finish {
  const float* bias;
  const float* other;
  int64_t other_row;
  int mode;
  float* out;
  int64_t out_row;
  int cols;

  // The same from row r, column c0, over `width` columns.
  Finish at(int64_t r, int64_t c0, int width) const {
    return {bias ? bias + c0 : nullptr, other ? other + r * other_row + c0 : nullptr,
            other_row, mode, out + r * out_row + c0, out_row, width};
  }
};

inline void finish_row(vf lo, vf hi, const Finish& f, int r) {
  const float* other = f.other ? f.other + r * f.other_row : nullptr;
  float* out = f.out + r * f.out_row;
  if (f.cols == NB) {
    if (f.bias) {
      lo = simd::add(lo, simd::load(f.bias));
      hi = simd::add(hi, simd::load(f.bias + W));
    }
    simd::store(out, epilogue::vector_epilogue(lo, f.mode, other));
    simd::store(out + W, epilogue::vector_epilogue(hi, f.mode, other ? other + W : nullptr));
    return;
  }
  float row[NB];
  simd::store(row, lo);
  simd::store(row + W, hi);
  for (int c = 0; c < f.cols; ++c)
    out[c] = epilogue::scalar_epilogue(row[c] + (f.bias ? f.bias[c] : 0.0f), f.mode, other, c);
}

// R rows of a (row r's k-th value at a[r * rows.row + k * rows.k]) x one block's kc x NB
// weights. first: the sums start at 0, else at acc (row stride acc_ld); last: finished into
// f, else stored back to acc.
struct Steps {
  int64_t row, k;
};
template <int R, bool PREFETCH>
void tile(const float* a, Steps steps, const float* w, int64_t kc, bool first, bool last,
          float* acc, int64_t acc_ld, const Finish& f, const float* next) {
  vf lo[R], hi[R];
  _Pragma("GCC unroll 12") for (int r = 0; r < R; ++r) {
    lo[r] = first ? simd::zero() : simd::load(acc + r * acc_ld);
    hi[r] = first ? simd::zero() : simd::load(acc + r * acc_ld + W);
  }
#pragma GCC unroll 4
  for (int64_t e = 0; e < kc; ++e) {
    if constexpr (PREFETCH) _mm_prefetch(reinterpret_cast<const char*>(next + e * NB),
                                         _MM_HINT_T0);
    const vf w0 = simd::load(w + e * NB), w1 = simd::load(w + e * NB + W);
    _Pragma("GCC unroll 12") for (int r = 0; r < R; ++r) {
      const vf x = simd::set1(a[r * steps.row + e * steps.k]);
      lo[r] = simd::fmadd(x, w0, lo[r]);
      hi[r] = simd::fmadd(x, w1, hi[r]);
    }
  }
  if (last) {
    _Pragma("GCC unroll 12") for (int r = 0; r < R; ++r) finish_row(lo[r], hi[r], f, r);
    return;
  }
  _Pragma("GCC unroll 12") for (int r = 0; r < R; ++r) {
    simd::store(acc + r * acc_ld, lo[r]);
    simd::store(acc + r * acc_ld + W, hi[r]);
  }
}

// One tile of `rows` (1..MR) rows, dispatched to its compile-time row count.
template <int R = MR>
void tile_any(int rows, const float* a, Steps steps, const float* w, int64_t kc, bool first,
              bool last, float* acc, int64_t acc_ld, const Finish& f, const float* next) {
  if constexpr (R > 1) {
    if (rows < R)
      return tile_any<R - 1>(rows, a, steps, w, kc, first, last, acc, acc_ld, f, next);
  }
  if (next)
    tile<R, true>(a, steps, w, kc, first, last, acc, acc_ld, f, next);
  else
    tile<R, false>(a, steps, w, kc, first, last, acc, acc_ld, f, next);
}

struct Gemm {
  const float* a;
  int64_t k, a_row;
  const float* w;
  int64_t n;
  Finish end;  // the whole output's

  // Rows [r0, r1) x blocks [b0, b1), every pass over k.
  void task(int64_t r0, int64_t r1, int64_t b0, int64_t b1) const {
    thread_local std::vector<float> scratch;  // a last block narrower than NB: its sums
    thread_local std::vector<float> panel;    // the pass's rows, packed (`packs`)
    if (packs()) panel.resize(kPanelRows * KC);
    for (int64_t k0 = 0; k0 < k; k0 += KC) {
      const int64_t kc = std::min(KC, k - k0);
      if (packs()) pack_rows(r0, r1, k0, kc, panel.data());
      for (int64_t b = b0; b < b1; ++b) block(r0, r1, b, k0, kc, panel.data(), scratch);
    }
  }

  // Whether a task copies its rows first (`pack_rows`): where they are a multiple of 4 KB
  // apart, a tile's rows share one L1 set (8 ways) with the weights' lines. Qwen3-0.6B's
  // shapes (K 1024, 2048, 3072) ran 1.06x faster packed; MiniLM's (384, 1536) 0.98x.
  bool packs() const { return a_row % 1024 == 0; }

  // Rows [r0, r1) x k [k0, k0 + kc) as each register tile reads them: its rows' k-th
  // values side by side ([kc][rows], tile after tile).
  void pack_rows(int64_t r0, int64_t r1, int64_t k0, int64_t kc, float* panel) const {
    for (int64_t r = r0; r < r1; r += MR) {
      const int64_t rows = std::min<int64_t>(MR, r1 - r);
      float* dst = panel + (r - r0) * kc;
      for (int64_t i = 0; i < rows; ++i) {
        const float* src = a + (r + i) * a_row + k0;
        for (int64_t e = 0; e < kc; ++e) dst[e * rows + i] = src[e];
      }
    }
  }

  void block(int64_t r0, int64_t r1, int64_t b, int64_t k0, int64_t kc, const float* panel,
             std::vector<float>& scratch) const {
    const int64_t c0 = b * NB;
    const int cols = (int)std::min<int64_t>(NB, n - c0);
    const bool first = k0 == 0, last = k0 + kc >= k;
    if (cols < NB) scratch.resize(kPanelRows * NB);
    const float* wb = w + b * k * NB + k0 * NB;
    for (int64_t r = r0; r < r1; r += MR) {
      const Finish f = end.at(r, c0, cols);
      float* acc = cols == NB ? f.out : scratch.data() + (r - r0) * NB;
      const int rows = (int)std::min<int64_t>(MR, r1 - r);
      const float* rows_a = packs() ? panel + (r - r0) * kc : a + r * a_row + k0;
      const Steps steps = packs() ? Steps{1, rows} : Steps{a_row, 1};
      // the first tile pulls the next block's weights of this pass into L1 (a block's are
      // K x NB floats apart: the hardware prefetcher's stream ends at each)
      const float* next = r == r0 && (b + 1) * NB < n ? wb + k * NB : nullptr;
      tile_any(rows, rows_a, steps, wb, kc, first, last, acc, cols == NB ? end.out_row : NB,
               f, next);
    }
  }
};

}  // namespace
#endif  // VLLM_SIMD_WIDTH

extern "C" {

// 1 where this build has the kernel (any SIMD build), else 0.
int vllm_f32_gemm_built() { return VLLM_SIMD_WIDTH ? 1 : 0; }

// Output columns per packed block (the layout at the top).
int vllm_f32_gemm_block() { return VLLM_SIMD_WIDTH * 2; }

// out [m, n] (row stride out_row) = epilogue(a [m, k] (row stride a_row) x the packed weight
// of n columns + bias [n] or null), mode as epilogue.h (other [m, n] of row stride
// other_row for modes 1 and 2, else null); norm_w [n] (norm_b [n] or null, eps): then each
// row layer-normed (int8_dequantize.h layer_norm_row), null: none. Returns 0, or 1 where
// the build has no SIMD.
int vllm_f32_gemm(const float* a, int64_t m, int64_t k, int64_t a_row, const float* w,
                  int64_t n, const float* bias, const float* other, int64_t other_row,
                  int mode, const float* norm_w, const float* norm_b, float eps, float* out,
                  int64_t out_row, int threads) {
#if !VLLM_SIMD_WIDTH
  return 1;
#else
  threads = std::max(threads, 1);
  const Gemm gemm{a, k, a_row, w, n, {bias, other, other_row, mode, out, out_row, (int)n}};
  const int64_t blocks = (n + NB - 1) / NB;
  const auto rows = gemm_tasks::RowSplit::balanced(m, kPanelRows, MR, threads);
  const int64_t per_task = std::min(gemm_tasks::blocks_per_task(rows.count, blocks, 1, threads),
                                    kTaskBlocks);
  const bool whole_rows = per_task >= blocks;
  gemm_tasks::for_each_task(rows, blocks, per_task, threads,
                            [&](int64_t r0, int64_t r1, int64_t b0, int64_t b1) {
    gemm.task(r0, r1, b0, b1);
    if (norm_w && whole_rows)  // the task's rows, while they are in L2
      for (int64_t r = r0; r < r1; ++r)
        int8_dequantize::layer_norm_row(out + r * out_row, n, norm_w, norm_b, eps);
  });
  if (norm_w && !whole_rows) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < m; ++r)
      int8_dequantize::layer_norm_row(out + r * out_row, n, norm_w, norm_b, eps);
  }
  return 0;
#endif
}

}  // extern "C"
