// What the two fused int8 GEMMs (int8_gemm_avx2.cpp, int8_gemm_vnni.cpp) share: the packed
// weight's block of 16 output columns, the float end of a register tile's rows (through
// int8_dequantize.h, so both give the separate pass's floats), run over the split of the
// output into row panels x column panels (gemm_tasks.h).
#pragma once

#include "gemm_tasks.h"
#include "int8_dequantize.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace int8_gemm {

constexpr int kBlock = 16;  // output columns per packed block (layers/int8_linear.pack_avx2)

#if VLLM_SIMD_WIDTH
// The float end: row and column scales, bias, epilogue mode and its other operand.
struct Dequantize {
  const float* row_scales;
  const float* col_scales;
  const float* bias;   // or null
  const float* other;  // [M, N] of row stride other_row (modes 1, 2), or null
  int64_t other_row;
  int mode;
  // after the epilogue, LayerNorm of each whole row (norm_w [N], norm_b [N] or null, eps);
  // norm_w null: none
  const float* norm_w = nullptr;
  const float* norm_b = nullptr;
  float eps = 0.0f;
  // each finished row rounded to bfloat16 here ([M, N] bits, row stride N) instead of
  // written as floats (AVX512-BF16 builds only: VLLM_INT8_BF16_OUT); null: floats
  uint16_t* bf16_out = nullptr;
};

// Row m's int32 sums of `cols` columns from column c0 (a multiple of 16, so the span's
// vectors fall on the same columns as the separate pass's) back to float in out (row
// stride ldc).
inline void store_row(const int32_t* sums, int64_t m, int64_t c0, int cols,
                      const Dequantize& dq, float* out, int64_t ldc) {
  int8_dequantize::span(sums, cols, dq.row_scales[m], dq.col_scales + c0,
                        dq.bias ? dq.bias + c0 : nullptr,
                        dq.other ? dq.other + m * dq.other_row + c0 : nullptr, dq.mode,
                        out + m * ldc + c0);
}

// The end of a task: rows [r0, r1) of its int32 sums (row stride ld, columns from c0) back
// to float in out (row stride n); with whole rows (the task has every column), each row
// layer-normed (dq.norm_w) and quantized for the next projection (q_out) while it is in L1.
// out null (whole rows and q_out or dq.bf16_out only, see `Floats`): each row's floats live
// only in a per-thread row, so an MLP's hidden rows that only the down projection reads,
// quantized, never go to memory (nor the float qkv rows an attention would round to bf16).
inline void finish_rows(const int32_t* sums, int64_t ld, int64_t r0, int64_t r1, int64_t c0,
                        int cols, const Dequantize& dq, float* out, int64_t n,
                        int8_t* q_out, float* q_scales, bool whole_rows) {
  thread_local std::vector<float> kept;
  if (!out) kept.resize(n);
  for (int64_t r = r0; r < r1; ++r) {
    float* row = out ? out + r * n : kept.data();
    store_row(sums + (r - r0) * ld, r, c0, cols, dq, row, 0);
    if (!whole_rows) continue;
    if (dq.norm_w) int8_dequantize::layer_norm_row(row, n, dq.norm_w, dq.norm_b, dq.eps);
    if (q_out) int8_dequantize::quantize_row(row, n, q_out + r * n, q_scales + r);
#if VLLM_INT8_BF16_OUT
    if (dq.bf16_out) int8_dequantize::round_row_bf16(row, n, dq.bf16_out + r * n);
#endif
  }
}

// Where tasks split the rows' columns: after them, each row layer-normed (dq.norm_w),
// quantized (q_out) and rounded to bf16 (dq.bf16_out), in a pass of its own.
inline void finish_split_rows(float* out, int64_t m, int64_t n, const Dequantize& dq,
                              int8_t* q_out, float* q_scales, int threads) {
  if (!dq.norm_w && !q_out && !dq.bf16_out) return;
#pragma omp parallel for num_threads(std::max(threads, 1)) schedule(static)
  for (int64_t r = 0; r < m; ++r) {
    float* row = out + r * n;
    if (dq.norm_w) int8_dequantize::layer_norm_row(row, n, dq.norm_w, dq.norm_b, dq.eps);
    if (q_out) int8_dequantize::quantize_row(row, n, q_out + r * n, q_scales + r);
#if VLLM_INT8_BF16_OUT
    if (dq.bf16_out) int8_dequantize::round_row_bf16(row, n, dq.bf16_out + r * n);
#endif
  }
}

// Where a GEMM's floats go: the caller's out, or where that is null (the caller wants only
// q_out or bf16 rows) nowhere when every task has whole rows, else a temporary [m, n] that
// finish_split_rows reads after the tasks.
struct Floats {
  std::vector<float> temp;
  float* out;
  Floats(float* given, int64_t m, int64_t n, bool whole_rows) : out(given) {
    if (!given && !whole_rows) {
      temp.resize(m * n);
      out = temp.data();
    }
  }
};

// A fused int8 GEMM (the AVX2, VNNI and AMX kernels) over its tasks, with their shared float
// end: sums(r0, r1, b0, b1, ld) makes one task's int32 sums (rows [r0, r1) x blocks
// [b0, b1)) and returns them, their row stride in ld; each task's rows then go back to
// float (finish_rows), and where tasks split the rows' columns, finish_split_rows after
// them all. out may be null (see `Floats`).
template <class Sums>
void run_tasks(const gemm_tasks::RowSplit& rows, int64_t n, int64_t task_blocks, int threads,
               const Dequantize& dq, float* out, int8_t* q_out, float* q_scales, Sums sums) {
  const int64_t m = rows.m, blocks = (n + kBlock - 1) / kBlock;
  const bool whole_rows = task_blocks >= blocks;
  const Floats floats(out, m, n, whole_rows);
  gemm_tasks::for_each_task(rows, blocks, task_blocks, threads,
                            [&](int64_t r0, int64_t r1, int64_t b0, int64_t b1) {
    int64_t ld = 0;
    const int32_t* s = sums(r0, r1, b0, b1, ld);
    const int cols = (int)(std::min(n, b1 * kBlock) - b0 * kBlock);
    finish_rows(s, ld, r0, r1, b0 * kBlock, cols, dq, floats.out, n, q_out, q_scales,
                whole_rows);
  });
  if (!whole_rows) finish_split_rows(floats.out, m, n, dq, q_out, q_scales, threads);
}
#endif

}  // namespace int8_gemm
