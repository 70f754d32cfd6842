// The int8 GEMM of `quantization="int8"` on CPUs with AVX512-VNNI, with the dequantizing
// end fused in (int8_gemm_avx2.cpp's formula and layout):
//
//   acc[m, n] = sum_k a[m, k] * w[n, k]    (a, w int8 in [-127, 127]; int32, exact)
//   out[m, n] = epilogue(acc[m, n] * row_scale[m] * col_scale[n] + bias[n])   (float32)
//
// Why not oneDNN (torch._int_mm) and a separate pass: its int32 [M, N] result goes to memory
// and is read back by the dequantizing pass (int8_linear.cpp), 8 bytes per output of extra
// traffic; here a task's sums stay in L1 / L2 until its rows become floats.
//
// vpdpbusd (_mm512_dpbusd_epi32) multiplies u8 by s8 and adds 4 products into each int32
// lane, without saturation (products fit in 17 bits, the lane wraps modulo 2^32). The
// activations are s8, so the kernel feeds u = a + 128 (a ^ 0x80 as a byte: 1..255) and
// the int32 lanes hold sum_k (a + 128) w = acc + 128 sum_k w[n, k]. That second term is a
// per-column constant, comp[n] = 128 * sum_k w[n, k] (|comp| <= 128 * 127 * K, below 2^31
// for K < 132,000), made at pack time; the accumulators start at -comp, so they end at acc
// exactly (integer arithmetic modulo 2^32 whose final value fits in int32 is exact), the
// integer oneDNN's VNNI GEMM computes, and the floats are the separate pass's bit for bit.
//
// Layout of the packed weight (layers/int8_weights.py `pack_avx2`, group 4): blocks
// of 16 output columns, each [ceil(K / 4)][16][4] bytes, columns past N and k past K zero.
// A group of 4 k of a block is 64 bytes: one zmm, 16 columns x 4 k, exactly what one
// vpdpbusd takes against a row's 4 bytes broadcast to all 16 lanes. A register tile is
// 6 rows x 4 blocks (64 columns): 24 accumulators + 4 weight vectors + 1 broadcast of the
// 32 zmm; each group loads 4 weight vectors and 6 broadcasts for 24 vpdpbusd.
//
// A task is a panel of <= 48 rows x (normally) all the columns: it copies its rows once into
// a buffer of a + 128 (zero-padded to a multiple of 4 k), sums them tile by tile into an
// int32 panel (K in chunks of at most 512, so a chunk's weights for a tile, 32 KiB, stay in
// L1 over the panel's rows), then turns whole rows to floats (int8_dequantize.h): out and
// the residual stream through memory in order. Dequantizing each tile's rows as soon as
// they were summed was as fast except with a residual: 64-column pieces of rows 4 N bytes
// apart were read from memory row by row, 30% slower at 8192 x 384, prefetching or not.
#include "int8_gemm_common.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && VLLM_SIMD_WIDTH == 16
#define VLLM_INT8_VNNI 1
#else
#define VLLM_INT8_VNNI 0
#endif

namespace {

using int8_gemm::kBlock;
constexpr int kTileRows = 6;         // rows per register tile
constexpr int kTileBlocks = 4;       // blocks per register tile
constexpr int64_t kPanelRows = 48;   // rows one task covers (a multiple of kTileRows)
constexpr int64_t kMaxChunk = 512;   // k one pass over a task covers (weights in L1)

#if VLLM_INT8_VNNI
// The weight every tile of a call reads.
struct Operands {
  const int8_t* w;      // the packed weight
  const int32_t* comp;  // [blocks * 16]: 128 * sum_k w[n, k]
  int64_t kp;           // K rounded up to a multiple of 4
};

// A task's rows, from row r0: their activations u (rows of kp bytes: a + 128, k past K
// 128, against zero weights) and their int32 sums (row stride ld, from column block b0).
struct Panel {
  const uint8_t* u;
  int32_t* sums;
  int64_t ld, r0, b0;
};

// R rows from row r x NB blocks from block b, k in [k0, k1): its sums start at -comp (the
// first chunk) or at the panel's partial sums, and go back there. Loops with constant
// bounds, fully unrolled: GCC keeps the R x NB accumulators in registers.
template <int R, int NB>
void tile(const Operands& op, const Panel& p, int64_t r, int64_t b, int64_t k0, int64_t k1) {
  const int64_t kp = op.kp, wstride = kp * kBlock;  // bytes between blocks
  const int8_t* w = op.w + b * wstride;
  const uint8_t* u = p.u + (r - p.r0) * kp;
  int32_t* sums = p.sums + (r - p.r0) * p.ld + (b - p.b0) * kBlock;
  __m512i acc[R][NB];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j)
      acc[i][j] = k0 == 0 ? _mm512_sub_epi32(_mm512_setzero_si512(),
                                             _mm512_loadu_si512(op.comp + (b + j) * kBlock))
                          : _mm512_loadu_si512(sums + i * p.ld + j * kBlock);
  }
  for (int64_t g = k0; g < k1; g += 4) {
    __m512i wv[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_si512(w + j * wstride + g * kBlock);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      int32_t group;
      std::memcpy(&group, u + i * kp + g, 4);
      const __m512i ui = _mm512_set1_epi32(group);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], ui, wv[j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) _mm512_storeu_si512(sums + i * p.ld + j * kBlock, acc[i][j]);
  }
}

template <int NB>
void tile_rows(int rows, const Operands& op, const Panel& p, int64_t r, int64_t b,
               int64_t k0, int64_t k1) {
  static_assert(kTileRows == 6, "one case per row count");
  switch (rows) {
    case 6: return tile<6, NB>(op, p, r, b, k0, k1);
    case 5: return tile<5, NB>(op, p, r, b, k0, k1);
    case 4: return tile<4, NB>(op, p, r, b, k0, k1);
    case 3: return tile<3, NB>(op, p, r, b, k0, k1);
    case 2: return tile<2, NB>(op, p, r, b, k0, k1);
    default: return tile<1, NB>(op, p, r, b, k0, k1);
  }
}

// A tile of `rows` rows x `blocks` blocks (the last tile of a panel may have fewer of each).
void any_tile(int rows, int blocks, const Operands& op, const Panel& p, int64_t r, int64_t b,
              int64_t k0, int64_t k1) {
  static_assert(kTileBlocks == 4, "one case per block count");
  switch (blocks) {
    case 4: return tile_rows<4>(rows, op, p, r, b, k0, k1);
    case 3: return tile_rows<3>(rows, op, p, r, b, k0, k1);
    case 2: return tile_rows<2>(rows, op, p, r, b, k0, k1);
    default: return tile_rows<1>(rows, op, p, r, b, k0, k1);
  }
}

// The int32 sums of rows [r0, r1) x blocks [b0, b1) into p, k in chunks of at most
// kMaxChunk: a chunk's weights for one tile's blocks (4 x 16 x 512 bytes) stay in L1 over
// the panel's row tiles, the panel's partial sums in L1 / L2 between chunks.
void panel_sums(const Operands& op, const Panel& p, int64_t r1, int64_t b1) {
  const int64_t chunks = (op.kp + kMaxChunk - 1) / kMaxChunk;
  const int64_t chunk = (op.kp / 4 + chunks - 1) / chunks * 4;
  for (int64_t k0 = 0; k0 < op.kp; k0 += chunk) {
    const int64_t k1 = std::min(op.kp, k0 + chunk);
    for (int64_t b = p.b0; b < b1; b += kTileBlocks) {
      const int blocks = (int)std::min<int64_t>(kTileBlocks, b1 - b);
      for (int64_t r = p.r0; r < r1; r += kTileRows)
        any_tile((int)std::min<int64_t>(kTileRows, r1 - r), blocks, op, p, r, b, k0, k1);
    }
  }
}

// The first n (0..64) bytes of a zmm.
inline __mmask64 first_bytes(int64_t n) {
  return n >= 64 ? ~0ull : n <= 0 ? 0ull : (1ull << n) - 1;
}

// a [rows, k] (row stride a_row) into rows of kp bytes u = a + 128 (a ^ 0x80), the pad 128.
void shift_rows(const int8_t* a, int64_t rows, int64_t k, int64_t a_row, int64_t kp,
                uint8_t* u) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < kp; c += 64) {
      const __m512i v = _mm512_maskz_loadu_epi8(first_bytes(k - c), a + r * a_row + c);
      _mm512_mask_storeu_epi8(u + r * kp + c, first_bytes(kp - c), _mm512_xor_si512(v, flip));
    }
  }
}
#endif

}  // namespace

extern "C" {

// 1 where this build has the VNNI int8 GEMM (built for a CPU with AVX512-VNNI), else 0.
int vllm_int8_gemm_vnni_built() { return VLLM_INT8_VNNI; }

// out [m, n] float32 (row stride n) = epilogue(a [m, k] int8 (row stride a_row) x the packed
// weight of n columns, comp [ceil(n / 16) * 16] its 128 * column sums (see the top)),
// dequantized as int8_dequantize.h with row_scales [m], col_scales [n], bias [n] or null,
// other [m, n] (row stride other_row, modes 1, 2) or null. q_out [m, n] int8 and q_scales
// [m], or both null: out's rows quantized as vllm_quantize_rows would (the next projection's
// input, without another pass over out); out may then be null (only q_out is made: the
// floats are not written). norm_w [n] (or null: none), norm_b [n] (or null), eps: each
// row of out layer-normed after the epilogue (before its quantization), as
// torch.nn.LayerNorm(n, eps). bf16_out [m, n] (or null): the rows rounded to bfloat16 there,
// out then null (no floats written). Returns 0; 1 where the build has no AVX512-VNNI; 3
// where bf16_out is asked of a build without AVX512-BF16.
int vllm_int8_gemm_vnni(const int8_t* a, int64_t m, int64_t k, int64_t a_row,
                        const int8_t* w_packed, const int32_t* comp, int64_t n,
                        const float* row_scales, const float* col_scales, const float* bias,
                        const float* other, int64_t other_row, int mode,
                        const float* norm_w, const float* norm_b, float eps,
                        uint16_t* bf16_out, float* out, int8_t* q_out, float* q_scales,
                        int threads) {
#if !VLLM_INT8_VNNI
  return 1;
#else
  if (bf16_out && !VLLM_INT8_BF16_OUT) return 3;
  threads = std::max(threads, 1);
  const int64_t kp = (k + 3) / 4 * 4, blocks = (n + kBlock - 1) / kBlock;
  const Operands op{w_packed, comp, kp};
  const int8_gemm::Dequantize dq{row_scales, col_scales, bias, other, other_row, mode,
                                  norm_w, norm_b, eps, bf16_out};
  const auto rows = gemm_tasks::RowSplit::balanced(m, kPanelRows, kTileRows, threads);
  const int64_t task_blocks = gemm_tasks::blocks_per_task(rows.count, blocks, kTileBlocks,
                                                          threads);
  int8_gemm::run_tasks(rows, n, task_blocks, threads, dq, out, q_out, q_scales,
                       [&](int64_t r0, int64_t r1, int64_t b0, int64_t b1, int64_t& ld) {
    // the task's rows shifted to u8 and its int32 sums: buffers in L1 / L2, reused
    thread_local std::vector<uint8_t> u;
    thread_local std::vector<int32_t> sums;
    u.resize(kPanelRows * kp);
    sums.resize(kPanelRows * task_blocks * kBlock);
    shift_rows(a + r0 * a_row, r1 - r0, k, a_row, kp, u.data());
    const Panel p{u.data(), sums.data(), (b1 - b0) * kBlock, r0, b0};
    panel_sums(op, p, r1, b1);
    ld = p.ld;  // then whole rows of the task's columns back to float, out and other in order
    return p.sums;
  });
  return 0;
#endif
}

}  // extern "C"
