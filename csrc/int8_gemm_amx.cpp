// The int8 GEMM of `quantization="int8"` on CPUs with AMX-INT8, with the dequantizing end
// fused in (int8_gemm_vnni.cpp's formula, layout and float end):
//
//   acc[m, n] = sum_k a[m, k] * w[n, k]    (a, w int8 in [-127, 127]; int32, exact)
//   out[m, n] = epilogue(acc[m, n] * row_scale[m] * col_scale[n] + bias[n])   (float32)
//
// Why not oneDNN (torch._int_mm) and a separate pass: as for the VNNI kernel, its int32
// [M, N] goes to memory and comes back for the dequantizing pass; and on a 2-core VM the
// per-call cost of oneDNN's AMX GEMM at a layer's shapes (N 384..3072) is a large share.
//
// AMX: eight tile registers of 16 rows x 64 bytes. tdpbssd (_tile_dpbssd) takes an A tile
// of 16 rows x 64 int8 k, a B tile of 16 rows each holding 4 consecutive k of 16 columns,
// and adds the 16 x 16 int32 products (signed x signed: no +128 shift, no compensation).
// The packed weight (layers/int8_linear.py `pack_avx2`: blocks of 16 columns, each
// [ceil(K / 4)][16][4] bytes) is exactly that B layout: a block's 16 groups from group g
// are one tile, 1 KiB at stride 64. Where K is not a multiple of 64 the last tile of a
// block reads on into the next block (or into the slack `pack_avx2(slack=...)` leaves
// after the last one): those k are zero in the activation tile, so they add nothing.
//
// Register tile: 2 A tiles (32 rows) x 2 B tiles (32 columns) into 4 accumulator tiles.
// A task is a panel of 64 rows x (normally) all the columns: it copies its rows into a
// zero-padded buffer (rows to a multiple of 32, k to a multiple of 64), sums each
// 32 x 32 tile over all of K, stores the int32 sums into the panel, then turns whole rows
// to floats (int8_dequantize.h), quantizing each one for the next projection where asked.
#include "int8_gemm_common.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && VLLM_SIMD_WIDTH == 16
#define VLLM_INT8_AMX 1
#else
#define VLLM_INT8_AMX 0
#endif

namespace {

#if VLLM_INT8_AMX
using int8_gemm::kBlock;
constexpr int64_t kPanelRows = 64;      // rows one task covers (a multiple of 32)
constexpr int64_t kTileK = 64;          // k one tile step covers

// ldtilecfg's 64-byte operand (palette 1): every tile 16 rows x 64 bytes.
struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Linux lends the AMX tile state to a process only on request (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); oneDNN asks the same. Once per process.
bool tiles_permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

// Each task configures its thread's tiles: oneDNN's AMX kernels, on the same OpenMP
// threads, leave other shapes configured.
void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// 32 rows of u (row stride kq bytes, kq a multiple of 64) x NB (1 or 2) blocks of the
// packed weight from w (wstride bytes between blocks), over all kq: int32 sums into
// sums (row stride ld ints). Tiles 0-3 the sums, 4-5 the rows, 6-7 the weight.
template <int NB>
void tile_32x(const int8_t* u, int64_t kq, const int8_t* w, int64_t wstride, int32_t* sums,
              int64_t ld) {
  _tile_zero(0);
  _tile_zero(1);
  if (NB == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t k0 = 0; k0 < kq; k0 += kTileK) {
    _tile_loadd(4, u + k0, kq);
    _tile_loadd(6, w + k0 * 16, 64);  // groups k0 / 4 .. + 15, 64 bytes each
    _tile_loadd(5, u + 16 * kq + k0, kq);
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 5, 6);
    if (NB == 2) {
      _tile_loadd(7, w + wstride + k0 * 16, 64);
      _tile_dpbssd(2, 4, 7);
      _tile_dpbssd(3, 5, 7);
    }
  }
  const int64_t stride = ld * 4;
  _tile_stored(0, sums, stride);
  _tile_stored(1, sums + 16 * ld, stride);
  if (NB == 2) {
    _tile_stored(2, sums + kBlock, stride);
    _tile_stored(3, sums + 16 * ld + kBlock, stride);
  }
}

// rows of a [rows, k] (row stride a_row) into a buffer of `padded` rows of kq bytes, the
// rest zero.
void copy_rows(const int8_t* a, int64_t rows, int64_t k, int64_t a_row, int64_t kq,
               int64_t padded, int8_t* u) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(u + r * kq, a + r * a_row, k);
    std::memset(u + r * kq + k, 0, kq - k);
  }
  std::memset(u + rows * kq, 0, (padded - rows) * kq);
}
#endif

}  // namespace

extern "C" {

// 1 where this build has the AMX int8 GEMM (built for a CPU with AMX-INT8), else 0.
int vllm_int8_gemm_amx_built() { return VLLM_INT8_AMX; }

// 1 where Linux lends this process AMX's tile state (kernel 5.16 or later), else 0.
int vllm_int8_gemm_amx_permitted() {
#if VLLM_INT8_AMX
  return tiles_permitted() ? 1 : 0;
#else
  return 0;
#endif
}

// As vllm_int8_gemm_vnni without comp: out [m, n] = epilogue(a [m, k] x the packed weight),
// its LayerNorm (norm_w, norm_b, eps), bf16_out, q_out / q_scales likewise. The packed
// weight must be readable for 1 KiB past its end (see the top). Returns 0; 1 where the
// build has no AMX-INT8; 2 where the kernel refused the process AMX's tile state; 3 as
// vllm_int8_gemm_vnni's.
int vllm_int8_gemm_amx(const int8_t* a, int64_t m, int64_t k, int64_t a_row,
                       const int8_t* w_packed, int64_t n, const float* row_scales,
                       const float* col_scales, const float* bias, const float* other,
                       int64_t other_row, int mode, const float* norm_w,
                       const float* norm_b, float eps, uint16_t* bf16_out, float* out,
                       int8_t* q_out, float* q_scales, int threads) {
#if !VLLM_INT8_AMX
  return 1;
#else
  if (!tiles_permitted()) return 2;
  if (bf16_out && !VLLM_INT8_BF16_OUT) return 3;
  threads = std::max(threads, 1);
  const int64_t kp = (k + 3) / 4 * 4, kq = (k + kTileK - 1) / kTileK * kTileK;
  const int64_t blocks = (n + kBlock - 1) / kBlock, wstride = kp * kBlock;
  const int8_gemm::Dequantize dq{row_scales, col_scales, bias, other, other_row, mode,
                                  norm_w, norm_b, eps, bf16_out};
  // split in pairs of blocks: a B tile is 32 columns
  // fixed panels: a panel starts on a multiple of kPanelRows (the tiles' row groups)
  const auto rows = gemm_tasks::RowSplit::fixed(m, kPanelRows);
  const int64_t task_blocks = gemm_tasks::blocks_per_task(rows.count, blocks, 2, threads);
  int8_gemm::run_tasks(rows, n, task_blocks, threads, dq, out, q_out, q_scales,
                       [&](int64_t r0, int64_t r1, int64_t b0, int64_t b1, int64_t& ld) {
    thread_local std::vector<int8_t> u;
    thread_local std::vector<int32_t> sums;
    const int64_t padded = (r1 - r0 + 31) / 32 * 32;
    ld = (b1 - b0) * kBlock;
    u.resize(kPanelRows * kq);
    sums.resize(kPanelRows * task_blocks * kBlock);
    copy_rows(a + r0 * a_row, r1 - r0, k, a_row, kq, padded, u.data());
    configure_tiles();
    for (int64_t b = b0; b < b1; b += 2) {
      const int8_t* w = w_packed + b * wstride;
      for (int64_t r = 0; r < padded; r += 32) {
        int32_t* s = sums.data() + r * ld + (b - b0) * kBlock;
        if (b + 1 < b1) tile_32x<2>(u.data() + r * kq, kq, w, wstride, s, ld);
        else tile_32x<1>(u.data() + r * kq, kq, w, wstride, s, ld);
      }
    }
    return static_cast<const int32_t*>(sums.data());
  });
  return 0;
#endif
}

}  // extern "C"
