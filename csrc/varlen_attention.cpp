// Attention over a packed batch of sequences (no padding), float32, AVX-512.
//
// torch's CPU SDPA multiplies its tiles through the BLAS sgemm, which on AMD CPUs is MKL's
// AVX2 code; with head_dim 32-128 and sequences of a few hundred tokens it reaches ~100
// GFLOP/s on 2 cores. This kernel transposes the keys once per call (in tiles of 64 keys),
// then runs one (sequence, head) per work item: scores as 4-query x 64-key register tiles
// of FMAs, an online (flash-style) softmax over key blocks of 64, and P*V as 4-query x
// 64-dim tiles. About 120-130 GFLOP/s here, 1.3-1.8x torch's SDPA.
//
// q: [Tq, Hq, D], k/v: [Tk, Hkv, D] (any row and head strides, unit stride in D);
// q_offsets / k_offsets: [B + 1] int64 offsets of each sequence's queries and (logical)
// keys. A sequence's nq queries are its last nq key positions (nq == nk without a cache;
// with a cached prefix the keys also hold the prefix), so under `causal` query i sees keys
// 0 .. nk - nq + i. key_rows (optional, [sum nk]) maps logical keys to rows of k/v, so the
// keys can be read straight from a paged KV cache; tile_ids (optional, one per logical
// 64-key tile) names equal tiles (a shared prefix) so each is transposed once.
// Returns out: [Tq, Hq, D] contiguous.
// Built lazily by vllm/model_executor/layers/cpu_kernels.py; D must be a multiple of 16.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

namespace {

constexpr int BQ = 32;  // query rows per block (8 micro-tiles of 4)
constexpr int BK = 64;  // keys per block (4 vectors of 16)

inline __m512 exp512(__m512 x) {
  // e^x = 2^n * e^r, n = round(x / ln2), |r| <= ln2 / 2; degree-6 Taylor for e^r.
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

struct Strides {
  int64_t row, head;
};

// Per-thread scratch for one (sequence, head) item.
struct Scratch {
  std::vector<float> qs, s, acc, m, l;
  void fit(int64_t d) {
    qs.resize(BQ * d);
    s.resize(BQ * BK);
    acc.resize(BQ * d);
    m.resize(BQ);
    l.resize(BQ);
  }
};

// S[0:4 rows][0:64] = qs[rows] . Kt[:, kb:kb+64]   (qs pre-scaled)
inline void scores_4x64(const float* qs, const float* kt, int64_t n_pad, int d, float* s) {
  __m512 c[4][4];
  for (int r = 0; r < 4; ++r)
    for (int u = 0; u < 4; ++u) c[r][u] = _mm512_setzero_ps();
  for (int e = 0; e < d; ++e) {
    const float* row = kt + e * n_pad;
    const __m512 k0 = _mm512_loadu_ps(row), k1 = _mm512_loadu_ps(row + 16),
                 k2 = _mm512_loadu_ps(row + 32), k3 = _mm512_loadu_ps(row + 48);
    for (int r = 0; r < 4; ++r) {
      const __m512 qv = _mm512_set1_ps(qs[r * d + e]);
      c[r][0] = _mm512_fmadd_ps(qv, k0, c[r][0]);
      c[r][1] = _mm512_fmadd_ps(qv, k1, c[r][1]);
      c[r][2] = _mm512_fmadd_ps(qv, k2, c[r][2]);
      c[r][3] = _mm512_fmadd_ps(qv, k3, c[r][3]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int u = 0; u < 4; ++u) _mm512_storeu_ps(s + r * BK + 16 * u, c[r][u]);
}

// Where the keys of one sequence live: logical key j is row rows[j] of k/v (rows == nullptr:
// row base + j), and its 64-key tile t is transposed at tiles + tile[t] * d * BK.
struct Keys {
  const int64_t* rows;
  int64_t base;
  const float* tiles;
  const int64_t* tile;
  int64_t tile_base;
  int64_t row(int64_t j) const { return rows ? rows[j] : base + j; }
  const float* tile_at(int64_t t, int d) const {
    return tiles + (tile ? tile[t] : tile_base + t) * d * BK;
  }
};

// acc[0:4 rows][dc:dc+16*NV] += P[rows][0:cols] . V[keys kb..kb+cols][dc:...] (NV fixed at
// compile time so the 4 x NV accumulators stay in registers)
template <int NV>
inline void pv_4rows(const float* p, const float* vh, int64_t vstride, const Keys& keys,
                     int64_t kb, int cols, int dc, float* acc, int d) {
  __m512 a[4][NV];
  for (int r = 0; r < 4; ++r)
    for (int u = 0; u < NV; ++u) a[r][u] = _mm512_loadu_ps(acc + r * d + dc + 16 * u);
  for (int j = 0; j < cols; ++j) {
    const float* vrow = vh + keys.row(kb + j) * vstride + dc;
    __m512 vv[NV];
    for (int u = 0; u < NV; ++u) vv[u] = _mm512_loadu_ps(vrow + 16 * u);
    for (int r = 0; r < 4; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * BK + j]);
      for (int u = 0; u < NV; ++u) a[r][u] = _mm512_fmadd_ps(pr, vv[u], a[r][u]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int u = 0; u < NV; ++u) _mm512_storeu_ps(acc + r * d + dc + 16 * u, a[r][u]);
}

inline void pv_block(int nv, const float* p, const float* vh, int64_t vstride, const Keys& keys,
                     int64_t kb, int cols, int dc, float* acc, int d) {
  switch (nv) {
    case 1: pv_4rows<1>(p, vh, vstride, keys, kb, cols, dc, acc, d); break;
    case 2: pv_4rows<2>(p, vh, vstride, keys, kb, cols, dc, acc, d); break;
    case 3: pv_4rows<3>(p, vh, vstride, keys, kb, cols, dc, acc, d); break;
    default: pv_4rows<4>(p, vh, vstride, keys, kb, cols, dc, acc, d); break;
  }
}

inline __mmask16 first_lanes(int n) {
  return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

// Online softmax of one score row over its first `valid` keys (the rest become 0);
// returns the factor the row's accumulator must be rescaled by.
inline float softmax_row(float* s, int valid, float* m, float* l) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 x[4];
  __m512 vmax = neg_inf;
  for (int u = 0; u < 4; ++u) {
    x[u] = _mm512_mask_loadu_ps(neg_inf, first_lanes(valid - 16 * u), s + 16 * u);
    vmax = _mm512_max_ps(vmax, x[u]);
  }
  const float mx = std::max(*m, _mm512_reduce_max_ps(vmax));
  const float corr = std::isinf(*m) ? 0.0f : std::exp(*m - mx);
  const __m512 vmx = _mm512_set1_ps(mx);
  __m512 vsum = _mm512_setzero_ps();
  for (int u = 0; u < 4; ++u) {
    const __m512 e = _mm512_maskz_mov_ps(first_lanes(valid - 16 * u),
                                         exp512(_mm512_sub_ps(x[u], vmx)));
    vsum = _mm512_add_ps(vsum, e);
    _mm512_storeu_ps(s + 16 * u, e);
  }
  *l = *l * corr + _mm512_reduce_add_ps(vsum);
  *m = mx;
  return corr;
}

// One (sequence, head): nq queries from row q_start, n keys described by `keys`.
void attend_item(const float* q, Strides qs_, const float* vh, int64_t vstride,
                 const Keys& keys, float* out, int64_t out_row, int64_t q_start, int64_t nq,
                 int64_t n, int64_t head, int d, float scale, bool causal, Scratch& sc) {
  const int64_t past = n - nq;  // keys before the first query
  sc.fit(d);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t i0 = 0; i0 < nq; i0 += BQ) {
    const int rows = (int)std::min<int64_t>(BQ, nq - i0);
    const int rows4 = (rows + 3) / 4 * 4;
    float* qsb = sc.qs.data();
    for (int r = 0; r < rows4; ++r) {
      const float* src = q + (q_start + i0 + r) * qs_.row + head * qs_.head;
      for (int e = 0; e < d; ++e) qsb[r * d + e] = r < rows ? src[e] * scale : 0.0f;
    }
    std::fill(sc.acc.begin(), sc.acc.begin() + rows4 * d, 0.0f);
    std::fill(sc.m.begin(), sc.m.end(), neg_inf);
    std::fill(sc.l.begin(), sc.l.end(), 0.0f);
    const int64_t kv_end = causal ? past + i0 + rows : n;
    for (int64_t kb = 0; kb < kv_end; kb += BK) {
      const int cols = (int)std::min<int64_t>(BK, kv_end - kb);
      float* s = sc.s.data();
      const float* tile = keys.tile_at(kb / BK, d);
      for (int r = 0; r < rows4; r += 4) scores_4x64(qsb + r * d, tile, BK, d, s + r * BK);
      for (int r = 0; r < rows4; ++r) {
        int valid = r < rows ? cols : 0;
        if (causal)
          valid = (int)std::min<int64_t>(valid, std::max<int64_t>(0, past + i0 + r - kb + 1));
        float* srow = s + r * BK;
        if (valid == 0) {
          std::fill(srow, srow + BK, 0.0f);
          continue;
        }
        const float corr = softmax_row(srow, valid, &sc.m[r], &sc.l[r]);
        if (corr != 1.0f) {
          float* a = sc.acc.data() + r * d;
          for (int e = 0; e < d; ++e) a[e] *= corr;
        }
      }
      for (int dc = 0; dc < d; dc += 64) {
        const int nv = std::min(64, d - dc) / 16;
        for (int r = 0; r < rows4; r += 4)
          pv_block(nv, s + r * BK, vh, vstride, keys, kb, cols, dc, sc.acc.data() + r * d, d);
      }
    }
    for (int r = 0; r < rows; ++r) {
      const float inv = 1.0f / sc.l[r];
      const float* a = sc.acc.data() + r * d;
      float* o = out + (q_start + i0 + r) * out_row + head * d;
      for (int e = 0; e < d; ++e) o[e] = a[e] * inv;
    }
  }
}

const int64_t* optional_index(const torch::Tensor& t, const char* name) {
  if (t.numel() == 0) return nullptr;
  TORCH_CHECK(t.scalar_type() == at::kLong && t.is_contiguous(), name,
              " must be a contiguous int64 tensor");
  return t.data_ptr<int64_t>();
}

}  // namespace

torch::Tensor varlen_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                               torch::Tensor q_offsets, torch::Tensor k_offsets,
                               torch::Tensor key_rows, torch::Tensor tile_ids, double scale,
                               bool causal) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat, "varlen_attention: float32 only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q, k, v must be [T, H, D]");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1,
              "q, k, v need unit stride in D");
  const int64_t hq = q.size(1), hkv = k.size(1), d = q.size(2);
  TORCH_CHECK(d % 16 == 0 && d <= 256, "head_dim must be a multiple of 16, at most 256");
  TORCH_CHECK(hq % hkv == 0, "query heads must be a multiple of key/value heads");
  auto qo = q_offsets.to(at::kLong).contiguous(), ko = k_offsets.to(at::kLong).contiguous();
  TORCH_CHECK(qo.numel() == ko.numel(), "q_offsets and k_offsets differ in length");
  const int64_t *qoff = qo.data_ptr<int64_t>(), *koff = ko.data_ptr<int64_t>();
  const int64_t b = qo.numel() - 1;
  for (int64_t i = 0; i < b; ++i)
    TORCH_CHECK(koff[i + 1] - koff[i] >= qoff[i + 1] - qoff[i],
                "a sequence has more queries than keys");
  const int64_t* rows = optional_index(key_rows, "key_rows");
  const int64_t* tile_of = optional_index(tile_ids, "tile_ids");
  if (rows) TORCH_CHECK(key_rows.numel() == koff[b], "key_rows needs one row per key");
  auto out = torch::empty({q.size(0), hq, d}, q.options());
  const Strides qs{q.stride(0), q.stride(1)}, ks{k.stride(0), k.stride(1)},
      vs{v.stride(0), v.stride(1)};
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();

  // Logical 64-key tiles: each sequence starts a new one. Distinct tiles (tile_ids) are
  // transposed once, into [Hkv][distinct tile][D][BK], shared by the heads of a group,
  // every query block and every sequence that names them.
  std::vector<int64_t> tile0(b + 1, 0);
  for (int64_t i = 0; i < b; ++i) tile0[i + 1] = tile0[i] + (koff[i + 1] - koff[i] + BK - 1) / BK;
  const int64_t tiles = tile0[b];
  if (tile_of) TORCH_CHECK(tile_ids.numel() == tiles, "tile_ids needs one id per 64-key tile");
  std::vector<int64_t> tile_seq(tiles);
  for (int64_t i = 0; i < b; ++i)
    std::fill(tile_seq.begin() + tile0[i], tile_seq.begin() + tile0[i + 1], i);
  std::vector<int64_t> first;  // the logical tile that defines each distinct tile
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t id = tile_of ? tile_of[t] : t;
    TORCH_CHECK(id >= 0 && id <= (int64_t)first.size(), "tile_ids must number tiles 0, 1, ...");
    if (id == (int64_t)first.size()) first.push_back(t);
  }
  const int64_t distinct = first.size();
  std::unique_ptr<float[]> kt(new float[std::max<int64_t>(hkv * distinct * d * BK, 1)]);
  at::parallel_for(0, hkv * distinct, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t h = c / distinct, t = first[c % distinct], seq = tile_seq[t];
      const int64_t j0 = (t - tile0[seq]) * BK;
      const int64_t cols = std::min<int64_t>(BK, koff[seq + 1] - koff[seq] - j0);
      float* dst = kt.get() + c * d * BK;
      if (cols < BK) std::fill(dst, dst + d * BK, 0.0f);
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t key = koff[seq] + j0 + j;
        const float* src = kp + (rows ? rows[key] : key) * ks.row + h * ks.head;
        for (int64_t e = 0; e < d; ++e) dst[e * BK + j] = src[e];
      }
    }
  });

  const int64_t items = b * hq, group = hq / hkv;
  // Costliest sequences first, handed out one at a time: the threads finish together.
  std::vector<int64_t> order(b);
  for (int64_t i = 0; i < b; ++i) order[i] = i;
  auto cost = [&](int64_t i) { return (qoff[i + 1] - qoff[i]) * (koff[i + 1] - koff[i]); };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return cost(x) > cost(y); });
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), std::max<int64_t>(items, 1));
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    Scratch sc;
    for (int64_t it; (it = next.fetch_add(1)) < items;) {
      const int64_t seq = order[it / hq], h = it % hq, kvh = h / group;
      const int64_t nq = qoff[seq + 1] - qoff[seq], nk = koff[seq + 1] - koff[seq];
      if (nq == 0) continue;
      const Keys keys{rows ? rows + koff[seq] : nullptr, koff[seq],
                      kt.get() + kvh * distinct * d * BK,
                      tile_of ? tile_of + tile0[seq] : nullptr, tile0[seq]};
      attend_item(qp, qs, vp + kvh * vs.head, vs.row, keys, op, hq * d, qoff[seq], nq, nk, h,
                  (int)d, (float)scale, causal, sc);
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("varlen_attention", &varlen_attention,
        "Attention over packed sequences (float32, AVX-512)",
        py::call_guard<py::gil_scoped_release>());
}
