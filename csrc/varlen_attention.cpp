// Attention over a packed batch of sequences (no padding), float32, AVX-512 or AVX2.
//
// torch's CPU SDPA multiplies its tiles through the BLAS sgemm; with head_dim 32-128 and
// sequences of a few hundred tokens that is far from the FMA peak. This kernel transposes
// the keys once per call (in tiles of 64 keys, W x W blocks in registers), then runs one
// (sequence, head) per work item: scores as RT-query x (NC vectors of keys) register
// tiles of FMAs, an online (flash-style) softmax over key blocks of 64 (in passes over the
// block's rows), and P*V as RT-query x (NV vectors of dims) tiles (RT: 4 on AVX-512, 6 on
// AVX2). The vector width (16 lanes on AVX-512, 8 on AVX2) is fixed at compile time
// (simd.h); the tile shapes keep the accumulators within the 32 / 16 vector registers.
//
// q: [Tq, Hq, D], k/v: [Tk, Hkv, D] (any row and head strides, unit stride in D);
// q_offsets / k_offsets: [B + 1] offsets of each sequence's queries and (logical) keys.
// A sequence's nq queries are its last nq key positions (nq == nk without a cache; with a
// cached prefix the keys also hold the prefix), so under `causal` query i sees keys
// 0 .. nk - nq + i. key_rows (optional, [sum nk]) maps logical keys to rows of k/v, so the
// keys can be read straight from a paged KV cache; tile_ids (optional, one per logical
// 64-key tile) names equal tiles (a shared prefix) so each is transposed once.
// out: [Tq, Hq, D] contiguous. A plain C entry point on raw pointers (no torch headers),
// called through ctypes by vllm/_kernels/cpu_kernel_calls.py; D % 16 == 0. The bfloat16
// twin (vdpbf16ps) is varlen_attention_bf16.cpp.
#include "online_softmax.h"
#include "simd.h"
#include "varlen_plan.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#if VLLM_SIMD_WIDTH
namespace {

using simd::vf;
using simd::W;

// The three parts of a block (scores, softmax, P.V) stay separate functions: inlined into
// one loop nest, GCC keeps the softmax's constants in registers across it and spills the
// micro-tiles' accumulators (AVX2, 16 registers: 0.75x; AVX-512: 0.9x).
#define PART __attribute__((noinline))

constexpr int BQ = 32;                 // query rows per block
constexpr int BK = varlen::BK;         // keys per block
constexpr int NC = W == 16 ? 4 : 2;    // key vectors per score micro-tile
constexpr int NVMAX = W == 16 ? 4 : 2; // dim vectors per P*V micro-tile (AVX2: 3 was
                                       // 5% / 19% slower on d = 32 / 64)
// Query rows per micro-tile: RT while that many are left, then 4, then 2 (rows come in
// fours). AVX2: 6 rows x 2 vectors = 12 accumulators, so 4-cycle FMAs at 2 a cycle have
// slack (4 x 2 = 8 left none): 1.12x / 1.17x at head_dim 64 / 128, 1.0x at 32; AVX-512
// keeps 4-row tiles of up to 16 accumulators.
constexpr int RT = W == 8 ? 6 : 4;
inline int tile_rows(int left) { return left >= RT ? RT : left >= 4 ? 4 : 2; }

// Per-thread scratch for one (sequence, head) item.
struct Scratch {
  std::vector<float> qs, s, acc, m, l, m_new, corr;
  std::vector<int> valid;
  void fit(int64_t d) {
    qs.resize(BQ * d);
    s.resize(BQ * BK);
    acc.resize(BQ * d);
    m.resize(BQ);
    l.resize(BQ * varlen::kSums);
    m_new.resize(BQ);
    corr.resize(BQ);
    valid.resize(BQ);
  }
  varlen::SoftmaxRows rows() {
    return {m.data(), l.data(), valid.data(), m_new.data(), corr.data()};
  }
};

// S[0:R rows][kc:kc + N * W] = qs[rows] . Kt[:, kc:...]   (qs pre-scaled; R and N fixed
// at compile time so the R x N accumulators stay in registers)
template <int R, int N>
inline void scores_chunk(const float* qs, const float* kt, int d, int kc, float* s) {
  vf c[R][N];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < N; ++u) c[r][u] = simd::zero();
  for (int e = 0; e < d; ++e) {
    const float* row = kt + e * BK + kc;
    vf kv[N];
    for (int u = 0; u < N; ++u) {
      kv[u] = simd::load(row + W * u);
      simd::in_register(kv[u]);
    }
    for (int r = 0; r < R; ++r) {
      const vf qv = simd::set1(qs[r * d + e]);
      for (int u = 0; u < N; ++u) c[r][u] = simd::fmadd(qv, kv[u], c[r][u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < N; ++u) simd::store(s + r * BK + kc + W * u, c[r][u]);
}

// S[0:R rows][0:cols rounded up to W]: NC key vectors at a time, the tail in as few as
// cover it (a short sequence's only block is mostly tail: scoring all 64 keys of it cost
// MiniLM's attention 5%).
template <int R>
inline void scores_rows(const float* qs, const float* kt, int d, int cols, float* s) {
  int kc = 0;
  for (; kc + NC * W <= cols; kc += NC * W) scores_chunk<R, NC>(qs, kt, d, kc, s);
  switch ((cols - kc + W - 1) / W) {
    case 0: break;
    case 1: scores_chunk<R, 1>(qs, kt, d, kc, s); break;
    case 2: scores_chunk<R, 2>(qs, kt, d, kc, s); break;
    case 3: scores_chunk<R, 3>(qs, kt, d, kc, s); break;
    default: scores_chunk<R, NC>(qs, kt, d, kc, s); break;
  }
}

// The scores of tile_rows(left) rows (returned).
PART int scores_block(const float* qs, const float* kt, int d, int cols, float* s, int left) {
  const int rows = tile_rows(left);
  if (rows == RT) scores_rows<RT>(qs, kt, d, cols, s);
  else if (rows == 4) scores_rows<4>(qs, kt, d, cols, s);
  else scores_rows<2>(qs, kt, d, cols, s);
  return rows;
}

// Where the keys of one sequence live: its 64-key tile t is distinct tile tile[t] (tile ==
// nullptr: tile_base + t), transposed at tiles + at(t) and, where V is copied, its V rows at
// vtiles + at(t); else logical key j's V row is row rows[j] of v (rows == nullptr: base + j).
struct Keys {
  const float* tiles;   // K tiles, transposed: [D][BK] each
  const float* vtiles;  // V tiles, [BK][D] each (the rows copied together), or null
  const int64_t* tile;
  int64_t tile_base;
  const float* v;       // else V's rows: logical key j is row rows[j] (rows null: base + j)
  int64_t v_row;
  const int64_t* rows;
  int64_t base;
  int64_t at(int64_t t, int d) const { return (tile ? tile[t] : tile_base + t) * d * BK; }
};

// Where the V rows of one key block are: row j at at + (rows ? rows[j] : first + j) * stride.
struct VRows {
  const float* at;
  int64_t stride;
  const int64_t* rows;
  int64_t first;
  const float* row(int j) const { return at + (rows ? rows[j] : first + j) * stride; }
  static VRows of(const Keys& keys, int64_t kb, int64_t tile_at, int d) {
    if (keys.vtiles) return {keys.vtiles + tile_at, d, nullptr, 0};
    return {keys.v, keys.v_row, keys.rows ? keys.rows + kb : nullptr, keys.base + kb};
  }
};

// acc[0:R rows][dc:dc+W*NV] += P[rows][0:cols] . V tile[0:cols][dc:...] (R and NV fixed
// at compile time so the R x NV accumulators stay in registers)
template <int R, int NV>
inline void pv_rows(const float* p, const VRows& vt, int cols, int dc, float* acc, int d) {
  vf a[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) a[r][u] = simd::load(acc + r * d + dc + W * u);
  for (int j = 0; j < cols; ++j) {
    const float* vrow = vt.row(j) + dc;
    vf vv[NV];
    for (int u = 0; u < NV; ++u) {
      vv[u] = simd::load(vrow + W * u);
      simd::in_register(vv[u]);
    }
    for (int r = 0; r < R; ++r) {
      const vf pr = simd::set1(p[r * BK + j]);
      for (int u = 0; u < NV; ++u) a[r][u] = simd::fmadd(pr, vv[u], a[r][u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) simd::store(acc + r * d + dc + W * u, a[r][u]);
}

template <int R>
inline void pv_dims(int nv, const float* p, const VRows& vt, int cols, int dc, float* acc,
                    int d) {
  switch (nv) {
    case 1: pv_rows<R, 1>(p, vt, cols, dc, acc, d); break;
    case 2: pv_rows<R, 2>(p, vt, cols, dc, acc, d); break;
    case 3: pv_rows<R, 3>(p, vt, cols, dc, acc, d); break;
    default: pv_rows<R, NVMAX>(p, vt, cols, dc, acc, d); break;
  }
}

// P*V of tile_rows(left) rows (returned) at nv dim vectors from dc.
PART int pv_block(int nv, const float* p, const VRows& vt, int cols, int dc, float* acc, int d,
                  int left) {
  const int rows = tile_rows(left);
  if (rows == RT) pv_dims<RT>(nv, p, vt, cols, dc, acc, d);
  else if (rows == 4) pv_dims<4>(nv, p, vt, cols, dc, acc, d);
  else pv_dims<2>(nv, p, vt, cols, dc, acc, d);
  return rows;
}

// The block's online softmax (online_softmax.h), the weights in place of the scores.
PART void softmax_block(float* s, int rows, int cols, const varlen::SoftmaxRows& st,
                        float* acc, int d) {
  varlen::online_softmax<false>(
      s, BK, rows, cols, 1.0f, st, acc, d,
      [&](int r, int u, vf e) {
        simd::store(s + r * BK + W * u, e);
        return e;
      },
      [&](int r) { std::fill(s + r * BK, s + r * BK + cols, 0.0f); });
}

struct Strides {
  int64_t row, head;
};

// One (sequence, head): nq queries from row q_start, n keys described by `keys`.
void attend_item(const float* q, Strides qs_, const Keys& keys, float* out, int64_t out_row,
                 int64_t q_start, int64_t nq, int64_t n, int64_t head, int d, float scale,
                 bool causal, Scratch& sc) {
  const int64_t past = n - nq;  // keys before the first query
  sc.fit(d);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto q_row = [&](int64_t i) { return q + (q_start + i) * qs_.row + head * qs_.head; };
  for (int64_t i0 = 0; i0 < nq; i0 += BQ) {
    const int rows = (int)std::min<int64_t>(BQ, nq - i0);
    const int rows4 = (rows + 3) / 4 * 4;
    float* qsb = sc.qs.data();
    for (int r = 0; r < rows4; ++r) {
      const float* src = q_row(i0 + r);
      for (int e = 0; e < d; ++e) qsb[r * d + e] = r < rows ? src[e] * scale : 0.0f;
    }
    for (int64_t i = i0 + BQ; i < std::min<int64_t>(nq, i0 + 2 * BQ); ++i)
      varlen::prefetch(q_row(i), d * sizeof(float));  // the next block's queries
    std::fill(sc.acc.begin(), sc.acc.begin() + rows4 * d, 0.0f);
    std::fill(sc.m.begin(), sc.m.end(), neg_inf);
    std::fill(sc.l.begin(), sc.l.end(), 0.0f);
    const int64_t kv_end = causal ? past + i0 + rows : n;
    for (int64_t kb = 0; kb < kv_end; kb += BK) {
      const int cols = (int)std::min<int64_t>(BK, kv_end - kb);
      float* s = sc.s.data();
      const int64_t at = keys.at(kb / BK, d);
      const float* tile = keys.tiles + at;
      const VRows vrows = VRows::of(keys, kb, at, d);
      for (int r = 0; r < rows4;)
        r += scores_block(qsb + r * d, tile, d, cols, s + r * BK, rows4 - r);
      for (int r = 0; r < rows4; ++r) {
        int valid = r < rows ? cols : 0;
        if (causal)
          valid = (int)std::min<int64_t>(valid, std::max<int64_t>(0, past + i0 + r - kb + 1));
        sc.valid[r] = valid;
      }
      softmax_block(s, rows4, cols, sc.rows(), sc.acc.data(), d);
      for (int dc = 0; dc < d; dc += NVMAX * W) {
        const int nv = std::min(NVMAX * W, d - dc) / W;
        for (int r = 0; r < rows4;)
          r += pv_block(nv, s + r * BK, vrows, cols, dc, sc.acc.data() + r * d, d,
                        rows4 - r);
      }
    }
    for (int r = 0; r < rows; ++r) {
      const float inv = 1.0f / varlen::row_sum(sc.rows(), r);
      const float* a = sc.acc.data() + r * d;
      float* o = out + (q_start + i0 + r) * out_row + head * d;
      for (int e = 0; e < d; ++e) o[e] = a[e] * inv;
    }
  }
}

}  // namespace
#endif  // VLLM_SIMD_WIDTH

extern "C" {

// The instruction set the kernels were compiled for: "avx512", "avx2" or "none".
const char* vllm_kernels_isa() { return VLLM_SIMD_NAME; }

// Returns 0, or 1 with a message in err[0:err_len] (bad offsets, ids or rows).
int vllm_varlen_attention(const float* q, int64_t q_row, int64_t q_head, const float* k,
                          int64_t k_row, int64_t k_head, const float* v, int64_t v_row,
                          int64_t v_head, float* out, int64_t hq, int64_t hkv, int64_t d,
                          const int64_t* qoff, const int64_t* koff, int64_t b,
                          const int64_t* rows, int64_t n_rows, const int64_t* tile_of,
                          int64_t n_tile_ids, float scale, int causal, int threads, char* err,
                          int64_t err_len) {
#define FAIL(...) return std::snprintf(err, err_len, __VA_ARGS__), 1
#if !VLLM_SIMD_WIDTH
  FAIL("varlen_attention: built without AVX2 or AVX-512");
#else
  threads = std::max(threads, 1);
  varlen::Plan plan;
  if (const char* why = varlen::make_plan(hq, hkv, d, qoff, koff, b, rows, n_rows, tile_of,
                                          n_tile_ids, plan))
    FAIL("%s", why);
  // Distinct tiles are transposed once, into [Hkv][distinct tile][D][BK], shared by the
  // heads of a group, every query block and every sequence that names them. Where P*V
  // reads each V row in more than two passes of NVMAX vectors (AVX2 from head_dim 64), the
  // rows are copied together beside them ([BK][D]), so those passes read one contiguous
  // tile rather than rows a few KiB apart (AVX2, head_dim 64: 1.06x, and the slow runs
  // of a page-walk-bound V gone); with one or two passes the copy cost more than it saved
  // (AVX-512 0.95-0.98x).
  const int64_t distinct = plan.distinct();
  const int64_t tiles_size = std::max<int64_t>(hkv * distinct * d * BK, 1);
  const bool pack_v = d > 2 * NVMAX * W;
  std::unique_ptr<float[]> kt(new float[tiles_size]), vt(pack_v ? new float[tiles_size] : nullptr);
  varlen::for_each_tile(plan, koff, hkv, threads, [&](int64_t c, int64_t h, int64_t key0,
                                                      int64_t cols) {
    float* dst = kt.get() + c * d * BK;
    for (int64_t j0 = 0; j0 < BK; j0 += W) {  // W keys x W dims at a time, in registers
      const float* src[W];
      for (int i = 0; i < W; ++i) {
        const int64_t key = key0 + j0 + i;
        src[i] = j0 + i < cols ? k + (rows ? rows[key] : key) * k_row + h * k_head : nullptr;
      }
      for (int64_t key = key0 + j0 + W; key < key0 + std::min<int64_t>(cols, j0 + 2 * W); ++key)
        varlen::prefetch(k + (rows ? rows[key] : key) * k_row + h * k_head, d * sizeof(float));
      for (int64_t e0 = 0; e0 < d; e0 += W) {
        vf r[W];
        for (int i = 0; i < W; ++i) r[i] = src[i] ? simd::load(src[i] + e0) : simd::zero();
        simd::transpose(r);
        for (int i = 0; i < W; ++i) simd::store(dst + (e0 + i) * BK + j0, r[i]);
      }
    }
    for (int64_t j = 0; pack_v && j < cols; ++j)
      std::memcpy(vt.get() + (c * BK + j) * d,
                  v + (rows ? rows[key0 + j] : key0 + j) * v_row + h * v_head, d * sizeof(float));
  });

  const int64_t group = hq / hkv;
  const Strides qs{q_row, q_head};
  varlen::for_each_item<Scratch>(qoff, koff, b, hq, threads, [&](int64_t seq, int64_t h,
                                                                 Scratch& sc) {
    const int64_t kvh = h / group;
    const int64_t nq = qoff[seq + 1] - qoff[seq], nk = koff[seq + 1] - koff[seq];
    const Keys keys{kt.get() + kvh * distinct * d * BK,
                    pack_v ? vt.get() + kvh * distinct * d * BK : nullptr,
                    tile_of ? tile_of + plan.tile0[seq] : nullptr, plan.tile0[seq],
                    v + kvh * v_head, v_row, rows ? rows + koff[seq] : nullptr, koff[seq]};
    attend_item(q, qs, keys, out, hq * d, qoff[seq], nq, nk, h, (int)d, scale, causal != 0,
                sc);
  });
  return 0;
#endif
#undef FAIL
}

}  // extern "C"
