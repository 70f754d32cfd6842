// Attention over a packed batch of sequences with bfloat16 q/k/v, on AVX512-BF16.
//
// The float32 kernel (varlen_attention.cpp) makes a bfloat16 model cast q/k/v to float32
// first and then runs one FMA per product. vdpbf16ps (_mm512_dpbf16_ps) multiplies 16
// *pairs* of bfloat16 and adds both products into each float32 lane, twice the products per
// instruction of an fp32 FMA, on operands half the bytes, with no cast pass.
//
// Q*K^T runs on vdpbf16ps: q and k are the model's bf16 values, their products are exact
// in fp32 and summed in fp32, so the scores are the float32 kernel's up to summation order.
// The softmax scale is applied to the fp32 scores (folding it into q would round q twice).
// The online softmax (max, exp, sums, rescaling) and the output accumulator are float32.
//
// P*V has two forms (bf16_pv):
// - float32 (the default): P stays float32 and V is widened once per tile (exactly), one
//   FMA per product. Measured on all-MiniLM-L6-v2 bf16, 512 texts, the bf16 form below
//   moved the engine's min cosine to float32 from 0.99991 (float32 attention) to 0.99988,
//   under the 0.9999 bar, so P is not rounded by default.
// - bf16: P rounded to bf16 (relative 2^-8 per weight) and vdpbf16ps, half the P*V
//   instructions. The row sums l are then taken over the *rounded* weights, so the weights
//   that multiply V still sum to 1 and the output stays a convex combination of V rows,
//   off by at most ~2^-7 max|v|.
//   Weights about to be rounded so coarsely come from a degree-4 exp2 (simd.h), 2.7e-6 off.
//
// The pairs must be adjacent in memory, so the operands are re-laid once per call, per
// (key/value head, distinct 64-key tile), into:
//   K tile [D/2][BK][2]: for a pair of dims, 64 keys x 2 dims = 4 zmm; a score micro-tile
//     (4 queries x 64 keys) broadcasts a query's (d, d+1) pair as one 32-bit value;
//   V tile, bf16 form [BK/2][D][2]: for a pair of keys, D dims x 2 keys; the P*V micro-tile
//     (4 queries x up to 64 dims) broadcasts a query's (P[j], P[j+1]) pair; float32 form
//     [BK][D], V rows contiguous, as the float32 kernel reads them.
// Keys past the end of a sequence's last tile are zeros in both (a zero V times a zero P
// adds nothing; garbage could be NaN, and 0 * NaN is NaN).
//
// Same interface and semantics as vllm_varlen_attention (packed offsets, key_rows into a
// paged cache, tile_ids for shared prefixes, causal with queries the last keys); q, k, v
// bfloat16 (uint16 bits), or float32 (in_f32: an int8 model's float32 projections, whose
// q and k are rounded to bf16, nearest even as torch's cast, where the kernel copies them
// anyway: the query block and the K tile; V stays float32 in the default P*V), strides in
// elements; out [Tq, Hq, D] bfloat16 or float32.
#include "online_softmax.h"
#include "simd.h"
#include "varlen_plan.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && VLLM_SIMD_WIDTH == 16
#define VLLM_ATTN_BF16 1
#else
#define VLLM_ATTN_BF16 0
#endif

#if VLLM_ATTN_BF16
namespace {

using bf16 = uint16_t;
constexpr int BQ = 32;          // query rows per block (8 micro-tiles of 4)
constexpr int BK = varlen::BK;  // keys per block / tile
constexpr int NV = 4;           // dim vectors (of 16) per P*V micro-tile

struct Scratch {
  std::vector<bf16> qs, p;       // [BQ][D] the block's queries; [BQ][BK] its weights
  std::vector<float> s, acc, m, l, m_new, corr;
  std::vector<int> valid;
  void fit(int64_t d) {
    qs.resize(BQ * d);
    p.resize(BQ * BK);
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

// A bf16 pair (two adjacent elements) broadcast to all 16 lanes.
inline __m512bh pair(const bf16* x) {
  uint32_t w;
  std::memcpy(&w, x, 4);
  return (__m512bh)_mm512_set1_epi32((int)w);
}
inline __m512bh load_bh(const bf16* x) { return (__m512bh)_mm512_loadu_si512(x); }
// 16 floats rounded (nearest even) to bf16, and those bf16 back as floats.
inline __m256i to_bf16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }
inline __m512 from_bf16(__m256i x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}

// S[0:4 rows][0:16 N] = qs[rows] . K tile (unscaled): d/2 steps of N loads,
// 4 broadcasts, 4 N vdpbf16ps into 4 N accumulators (N fixed at compile time).
template <int N>
inline void scores_chunk(const bf16* qs, const bf16* kt, int d, float* s) {
  __m512 c[4][N];
  for (int r = 0; r < 4; ++r)
    for (int u = 0; u < N; ++u) c[r][u] = _mm512_setzero_ps();
  for (int e = 0; e < d; e += 2) {
    const bf16* row = kt + e * BK;  // pair e / 2: BK keys x 2 dims
    __m512bh kv[N];
    for (int u = 0; u < N; ++u) {
      kv[u] = load_bh(row + 32 * u);
      simd::in_register(kv[u]);
    }
    for (int r = 0; r < 4; ++r) {
      const __m512bh qv = pair(qs + r * d + e);
      for (int u = 0; u < N; ++u) c[r][u] = _mm512_dpbf16_ps(c[r][u], qv, kv[u]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int u = 0; u < N; ++u) _mm512_storeu_ps(s + r * BK + 16 * u, c[r][u]);
}

// S[0:4 rows][0:cols rounded up to 16]: a short tile's keys past that are not scored.
inline void scores_4rows(const bf16* qs, const bf16* kt, int d, int cols, float* s) {
  switch ((cols + 15) / 16) {
    case 1: scores_chunk<1>(qs, kt, d, s); break;
    case 2: scores_chunk<2>(qs, kt, d, s); break;
    case 3: scores_chunk<3>(qs, kt, d, s); break;
    default: scores_chunk<4>(qs, kt, d, s); break;
  }
}

// acc[0:4 rows][dc:dc + 16 N] += P[rows][0:cols] . V tile[0:cols][dc:...], a pair of keys
// per step (N fixed at compile time: the 4 x N accumulators stay in registers).
template <int N>
inline void pv_4rows(const bf16* p, const bf16* vt, int cols, int dc, float* acc, int d) {
  __m512 a[4][N];
  for (int r = 0; r < 4; ++r)
    for (int u = 0; u < N; ++u) a[r][u] = _mm512_loadu_ps(acc + r * d + dc + 16 * u);
  for (int j = 0; j < cols; j += 2) {
    const bf16* vrow = vt + (j * d + 2 * dc);  // pair j / 2: D dims x 2 keys
    __m512bh vv[N];
    for (int u = 0; u < N; ++u) {
      vv[u] = load_bh(vrow + 32 * u);
      simd::in_register(vv[u]);
    }
    for (int r = 0; r < 4; ++r) {
      const __m512bh pr = pair(p + r * BK + j);
      for (int u = 0; u < N; ++u) a[r][u] = _mm512_dpbf16_ps(a[r][u], pr, vv[u]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int u = 0; u < N; ++u) _mm512_storeu_ps(acc + r * d + dc + 16 * u, a[r][u]);
}

// The same for R rows with float32 weights P (scratch s, [R][BK]) against the V tile as
// float32 [BK][D]: one FMA per product, P not rounded. With few dim vectors (d = 32: N = 2)
// 4 rows give 8 FMAs per 2 loads + 4 broadcasts; 8 rows give 16 per 2 + 8.
template <int R, int N>
inline void pv_f32(const float* p, const float* vt, int cols, int dc, float* acc, int d) {
  __m512 a[R][N];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < N; ++u) a[r][u] = _mm512_loadu_ps(acc + r * d + dc + 16 * u);
  for (int j = 0; j < cols; ++j) {
    const float* vrow = vt + j * d + dc;
    __m512 vv[N];
    for (int u = 0; u < N; ++u) {
      vv[u] = _mm512_loadu_ps(vrow + 16 * u);
      simd::in_register(vv[u]);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * BK + j]);
      for (int u = 0; u < N; ++u) a[r][u] = _mm512_fmadd_ps(pr, vv[u], a[r][u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < N; ++u) _mm512_storeu_ps(acc + r * d + dc + 16 * u, a[r][u]);
}

// One block's P*V at dims dc .. dc + 16 N.
struct PvArgs {
  const Scratch& sc;
  const void* vt;  // the V tile: bf16 [BK/2][D][2] (bf16 P) or float32 [BK][D]
  bool bf16_p;
  int cols, d, rows4;
};
// Rows r .. of it (4 or 8, returned), into acc (row r's accumulator).
template <int N>
inline int pv_rows(const PvArgs& a, int r, int dc, float* acc) {
  if (a.bf16_p) {
    pv_4rows<N>(a.sc.p.data() + r * BK, static_cast<const bf16*>(a.vt), a.cols, dc, acc, a.d);
    return 4;
  }
  const float* p = a.sc.s.data() + r * BK;
  const float* vt = static_cast<const float*>(a.vt);
  if (N <= 2 && r + 8 <= a.rows4) {
    pv_f32<8, N>(p, vt, a.cols, dc, acc, a.d);
    return 8;
  }
  pv_f32<4, N>(p, vt, a.cols, dc, acc, a.d);
  return 4;
}
inline int pv_block(const PvArgs& a, int n, int r, int dc, float* acc) {
  switch (n) {
    case 1: return pv_rows<1>(a, r, dc, acc);
    case 2: return pv_rows<2>(a, r, dc, acc);
    case 3: return pv_rows<3>(a, r, dc, acc);
    default: return pv_rows<NV>(a, r, dc, acc);
  }
}

// Where one sequence's prepared tiles are: logical tile t is distinct tile tile[t]
// (tile == nullptr: tile_base + t); each tile is d * BK elements in kt (bf16) and in vt
// (bf16 pairs where bf16_p, else float32).
struct Tiles {
  const bf16* kt;
  const void* vt;
  bool bf16_p;
  const int64_t* tile;
  int64_t tile_base;
  int64_t head;  // the element offset of the key/value head's tiles
  int64_t at(int64_t t, int d) const {
    return head + (tile ? tile[t] : tile_base + t) * d * BK;
  }
  const void* v_at(int64_t at) const {
    if (bf16_p) return static_cast<const bf16*>(vt) + at;
    return static_cast<const float*>(vt) + at;
  }
};

struct Query {
  const void* q;      // bf16, or float32 where f32
  int64_t row, head;  // strides
  bool f32;
};

// 16 floats rounded to bf16 (nearest even, NaN kept), as torch's cast rounds them.
inline void round_16(const float* x, bf16* out) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), to_bf16(_mm512_loadu_ps(x)));
}

// d elements of a bf16 or float32 row (d % 16 == 0) as bf16.
inline void row_bf16(const void* src, bool f32, int64_t d, bf16* out) {
  if (!f32) {  // 32 bytes at a time: a memcpy call per 64-byte row cost ~3%
    for (int64_t e = 0; e < d; e += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + e),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                              static_cast<const bf16*>(src) + e)));
    return;
  }
  for (int64_t e = 0; e < d; e += 16) round_16(static_cast<const float*>(src) + e, out + e);
}

struct Out {
  void* out;
  bool bf16_out;
  int64_t row;  // stride: hq * d
};

// Copies rows [i0, i0 + rows) of one head's queries into qs, zero rows up to a multiple of 4.
inline void load_queries(const Query& q, int64_t first, int rows, int rows4, int64_t head,
                         int d, bf16* qs) {
  const int size = q.f32 ? 4 : 2;
  for (int r = 0; r < rows4; ++r) {
    if (r < rows)
      row_bf16(static_cast<const char*>(q.q) + ((first + r) * q.row + head * q.head) * size,
               q.f32, d, qs + r * d);
    else
      std::fill(qs + r * d, qs + (r + 1) * d, bf16(0));
  }
}

// Row r of the block's output: acc / l, as bf16 or float32.
inline void store_row(const Out& o, int64_t row, int64_t head, const float* a, float l,
                      int d) {
  const __m512 inv = _mm512_set1_ps(1.0f / l);
  for (int e = 0; e < d; e += 16) {
    const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(a + e), inv);
    if (o.bf16_out)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(
          static_cast<bf16*>(o.out) + row * o.row + head * d + e), to_bf16(y));
    else
      _mm512_storeu_ps(static_cast<float*>(o.out) + row * o.row + head * d + e, y);
  }
}

// Softmax of the block's score rows against keys kb .. kb + cols - 1 (online_softmax.h),
// rescaling the rows' accumulators; weights to sc.p rounded to bf16 (bf16_p: l then sums
// the rounded weights P*V will use) or in place in sc.s.
inline void softmax_block(Scratch& sc, int rows, int rows4, int cols, int64_t kb,
                          int64_t first_pos, bool causal, float scale, int d, bool bf16_p) {
  for (int r = 0; r < rows4; ++r) {
    int valid = r < rows ? cols : 0;
    if (causal)
      valid = (int)std::min<int64_t>(valid, std::max<int64_t>(0, first_pos + r - kb + 1));
    sc.valid[r] = valid;
  }
  float* s = sc.s.data();
  bf16* p = sc.p.data();
  const varlen::SoftmaxRows st = sc.rows();
  if (bf16_p)
    varlen::online_softmax<true>(
        s, BK, rows4, cols, scale, st, sc.acc.data(), d,
        [&](int r, int u, __m512 e) {
          const __m256i eb = to_bf16(e);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + r * BK + 16 * u), eb);
          return from_bf16(eb);
        },
        [&](int r) { std::fill(p + r * BK, p + (r + 1) * BK, bf16(0)); });
  else
    varlen::online_softmax<false>(
        s, BK, rows4, cols, scale, st, sc.acc.data(), d,
        [&](int r, int u, __m512 e) {
          _mm512_storeu_ps(s + r * BK + 16 * u, e);
          return e;
        },
        [&](int r) { std::fill(s + r * BK, s + (r + 1) * BK, 0.0f); });
}

// One (sequence, head): nq queries from row q_start over n keys (its prepared tiles).
void attend_item(const Query& q, const Tiles& tiles, const Out& out, int64_t q_start,
                 int64_t nq, int64_t n, int64_t head, int d, float scale, bool causal,
                 Scratch& sc) {
  const int64_t past = n - nq;  // keys before the first query
  sc.fit(d);
  for (int64_t i0 = 0; i0 < nq; i0 += BQ) {
    const int rows = (int)std::min<int64_t>(BQ, nq - i0);
    const int rows4 = (rows + 3) / 4 * 4;
    load_queries(q, q_start + i0, rows, rows4, head, d, sc.qs.data());
    std::fill(sc.acc.begin(), sc.acc.begin() + rows4 * d, 0.0f);
    std::fill(sc.m.begin(), sc.m.end(), -std::numeric_limits<float>::infinity());
    std::fill(sc.l.begin(), sc.l.end(), 0.0f);
    const int64_t kv_end = causal ? past + i0 + rows : n;
    for (int64_t kb = 0; kb < kv_end; kb += BK) {
      const int cols = (int)std::min<int64_t>(BK, kv_end - kb);
      const int64_t at = tiles.at(kb / BK, d);
      for (int r = 0; r < rows4; r += 4)
        scores_4rows(sc.qs.data() + r * d, tiles.kt + at, d, cols, sc.s.data() + r * BK);
      softmax_block(sc, rows, rows4, cols, kb, past + i0, causal, scale, d, tiles.bf16_p);
      const PvArgs pv{sc, tiles.v_at(at), tiles.bf16_p, cols, d, rows4};
      for (int dc = 0; dc < d; dc += NV * 16) {
        const int nv = std::min(NV * 16, d - dc) / 16;
        for (int r = 0; r < rows4;) r += pv_block(pv, nv, r, dc, sc.acc.data() + r * d);
      }
    }
    for (int r = 0; r < rows; ++r)
      store_row(out, q_start + i0 + r, head, sc.acc.data() + r * d,
                varlen::row_sum(sc.rows(), r), d);
  }
}

// Where one head's K or V rows are: bf16, or float32 where f32; strides in elements.
struct Rows {
  const void* base;
  int64_t row, head;
  const int64_t* rows;  // logical key -> row (nullptr: the key itself)
  bool f32;
  const char* at(int64_t key, int64_t h) const {
    return static_cast<const char*>(base) +
           ((rows ? rows[key] : key) * row + h * head) * (f32 ? 4 : 2);
  }
};

// 16 pairs (dims 2 e0 .. 2 e0 + 31) of a K row as 16 32-bit values, the first `pairs`
// of them (the rest zero); a float32 row rounded to bf16 on the way.
inline __m512 load_pairs(const char* src, bool f32, int64_t e0, int pairs) {
  if (!f32)
    return _mm512_maskz_loadu_ps((__mmask16)((1u << pairs) - 1),
                                 reinterpret_cast<const float*>(src) + e0);
  const float* x = reinterpret_cast<const float*>(src) + 2 * e0;
  const int n = 2 * pairs, n_lo = std::min(n, 16), n_hi = n - n_lo;
  const __m512 lo = _mm512_maskz_loadu_ps((__mmask16)((1u << n_lo) - 1), x);
  const __m512 hi = _mm512_maskz_loadu_ps((__mmask16)((1u << n_hi) - 1), x + 16);
  return (__m512)_mm512_cvtne2ps_pbh(hi, lo);
}

// K tile [D/2][BK][2] from keys key0 .. key0 + cols - 1 (a pair of bf16 is one 32-bit
// value: this is a 32-bit transpose, 16 keys x 16 pairs at a time in registers), zeros past
// cols.
void pack_k(const Rows& k, int64_t h, int64_t key0, int64_t cols, int64_t d, bf16* dst) {
  float* out = reinterpret_cast<float*>(dst);  // the pairs' bits, moved as floats
  for (int64_t j0 = 0; j0 < BK; j0 += 16) {
    const char* src[16];
    for (int i = 0; i < 16; ++i)
      src[i] = j0 + i < cols ? k.at(key0 + j0 + i, h) : nullptr;
    for (int64_t e0 = 0; e0 < d / 2; e0 += 16) {  // d / 2 is a multiple of 8
      const int pairs = (int)std::min<int64_t>(16, d / 2 - e0);
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = src[i] ? load_pairs(src[i], k.f32, e0, pairs) : _mm512_setzero_ps();
      simd::transpose(r);
      for (int i = 0; i < pairs; ++i) _mm512_storeu_ps(out + (e0 + i) * BK + j0, r[i]);
    }
  }
}

// 16 elements (from e) of a bf16 or float32 row as bf16 in the low halves of 32-bit lanes.
inline __m512i widen_16(const char* src, bool f32, int64_t e) {
  const __m256i h = f32 ? to_bf16(_mm512_loadu_ps(reinterpret_cast<const float*>(src) + e))
                        : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                              reinterpret_cast<const bf16*>(src) + e));
  return _mm512_cvtepu16_epi32(h);
}

// V tile [BK/2][D][2] from keys key0 .. key0 + cols - 1 (two keys' rows interleaved, 16
// dims of a pair at a time), zeros past cols.
void pack_v(const Rows& v, int64_t h, int64_t key0, int64_t cols, int64_t d, bf16* dst) {
  std::fill(dst + (cols + 1) / 2 * 2 * d, dst + BK * d, bf16(0));
  for (int64_t j = 0; j < cols; j += 2) {
    const char* a = v.at(key0 + j, h);
    const char* b = j + 1 < cols ? v.at(key0 + j + 1, h) : nullptr;
    bf16* o = dst + j * d;  // pair j / 2
    for (int64_t e = 0; e < d; e += 16) {
      __m512i pairs = widen_16(a, v.f32, e);
      if (b) pairs = _mm512_or_si512(pairs, _mm512_slli_epi32(widen_16(b, v.f32, e), 16));
      _mm512_storeu_si512(o + 2 * e, pairs);
    }
  }
}

// V tile as float32 [BK][D] from keys key0 .. key0 + cols - 1 (bf16 widens exactly; float32
// is copied), zeros past cols.
void pack_v_f32(const Rows& v, int64_t h, int64_t key0, int64_t cols, int64_t d, float* dst) {
  std::fill(dst + cols * d, dst + BK * d, 0.0f);
  for (int64_t j = 0; j < cols; ++j) {
    const char* src = v.at(key0 + j, h);
    if (v.f32) {
      std::memcpy(dst + j * d, src, d * sizeof(float));
      continue;
    }
    for (int64_t e = 0; e < d; e += 16)
      _mm512_storeu_ps(dst + j * d + e, from_bf16(_mm256_loadu_si256(
                                            reinterpret_cast<const __m256i*>(src) + e / 16)));
  }
}

}  // namespace
#endif  // VLLM_ATTN_BF16

extern "C" {

// 1 where this build has the bfloat16 attention kernel (built for a CPU with
// AVX512-BF16), else 0.
int vllm_varlen_attention_bf16_built() { return VLLM_ATTN_BF16; }

// As vllm_varlen_attention, on bfloat16 q/k/v (their bits as uint16), or float32 ones
// where in_f32 (q and k rounded to bf16 as the kernel copies them); out is bfloat16 where
// out_bf16, else float32. bf16_pv: P*V with vdpbf16ps on P rounded to bf16, else
// with float32 FMAs on float32 P (see the top of the file for why that is the default).
// Returns 0, or 1 with a message in err[0:err_len].
int vllm_varlen_attention_bf16(const void* q, int64_t q_row, int64_t q_head,
                               const void* k, int64_t k_row, int64_t k_head,
                               const void* v, int64_t v_row, int64_t v_head, void* out,
                               int out_bf16, int bf16_pv, int in_f32, int64_t hq, int64_t hkv,
                               int64_t d, const int64_t* qoff, const int64_t* koff, int64_t b,
                               const int64_t* rows, int64_t n_rows, const int64_t* tile_of,
                               int64_t n_tile_ids, float scale, int causal, int threads,
                               char* err, int64_t err_len) {
#define FAIL(...) return std::snprintf(err, err_len, __VA_ARGS__), 1
#if !VLLM_ATTN_BF16
  FAIL("varlen_attention_bf16: built without AVX512-BF16");
#else
  threads = std::max(threads, 1);
  varlen::Plan plan;
  if (const char* why = varlen::make_plan(hq, hkv, d, qoff, koff, b, rows, n_rows, tile_of,
                                          n_tile_ids, plan))
    FAIL("%s", why);
  // Each distinct tile's K and V re-laid once, [Hkv][distinct tile][d * BK], shared by the
  // heads of a group, every query block and every sequence that names the tile.
  const int64_t distinct = plan.distinct(), tile_size = d * BK;
  const int64_t n = std::max<int64_t>(hkv * distinct * tile_size, 1);
  std::unique_ptr<bf16[]> kt(new bf16[n]);
  std::unique_ptr<float[]> vt(new float[n]);  // room for either V layout
  const Rows ks{k, k_row, k_head, rows, in_f32 != 0}, vs{v, v_row, v_head, rows, in_f32 != 0};
  varlen::for_each_tile(plan, koff, hkv, threads, [&](int64_t c, int64_t h, int64_t key0,
                                                      int64_t cols) {
    pack_k(ks, h, key0, cols, d, kt.get() + c * tile_size);
    if (bf16_pv)
      pack_v(vs, h, key0, cols, d, reinterpret_cast<bf16*>(vt.get()) + c * tile_size);
    else
      pack_v_f32(vs, h, key0, cols, d, vt.get() + c * tile_size);
  });

  const int64_t group = hq / hkv;
  const Query qq{q, q_row, q_head, in_f32 != 0};
  const Out o{out, out_bf16 != 0, hq * d};
  varlen::for_each_item<Scratch>(qoff, koff, b, hq, threads, [&](int64_t seq, int64_t h,
                                                                 Scratch& sc) {
    const int64_t kvh = h / group, head_tiles = kvh * distinct * tile_size;
    const Tiles tiles{kt.get(), vt.get(), bf16_pv != 0,
                      tile_of ? tile_of + plan.tile0[seq] : nullptr, plan.tile0[seq], head_tiles};
    attend_item(qq, tiles, o, qoff[seq], qoff[seq + 1] - qoff[seq], koff[seq + 1] - koff[seq],
                h, (int)d, scale, causal != 0, sc);
  });
  return 0;
#endif
#undef FAIL
}

}  // extern "C"
