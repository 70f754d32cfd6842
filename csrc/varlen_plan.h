// The bookkeeping the float32 and bfloat16 packed-sequence attention kernels share
// (varlen_attention.cpp, varlen_attention_bf16.cpp): checking the offsets, numbering the
// 64-key tiles (each sequence starts a new one; tile_ids can name equal tiles so each is
// prepared once), and handing (sequence, head) items to the threads, costliest first.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace varlen {

constexpr int BK = 64;  // keys per tile / per key block

// Asks for the cache lines of [p, p + bytes) ahead of their use. The q and k rows of a head
// come from memory (the projection's output, rows a few KiB apart, each read once per
// head): the float32 kernel fetching the next query block and the next 16 keys this way
// ran MiniLM's attention 1.06x (AVX-512) / 1.03x (AVX2) faster, head_dim 64 / 128 1.00x.
// The bf16 kernel with the same prefetches ran 0.9x at head_dim 64 / 128: it has none.
inline void prefetch(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(c + at);
}

struct Plan {
  std::vector<int64_t> tile0;     // [b + 1]: each sequence's first logical tile
  std::vector<int64_t> tile_seq;  // the sequence of each logical tile
  std::vector<int64_t> first;     // the logical tile that defines each distinct tile
  int64_t distinct() const { return (int64_t)first.size(); }
};

// The logical tiles and the distinct ones; nullptr, or what is wrong with the input.
inline const char* make_plan(int64_t hq, int64_t hkv, int64_t d, const int64_t* qoff,
                             const int64_t* koff, int64_t b, const int64_t* rows,
                             int64_t n_rows, const int64_t* tile_of, int64_t n_tile_ids,
                             Plan& p) {
  if (d % 16 || d > 256) return "head_dim must be a multiple of 16, at most 256";
  if (hkv <= 0 || hq % hkv) return "query heads must be a multiple of key/value heads";
  for (int64_t i = 0; i < b; ++i)
    if (koff[i + 1] - koff[i] < qoff[i + 1] - qoff[i]) return "a sequence has more queries than keys";
  if (rows && n_rows != koff[b]) return "key_rows needs one row per key";
  p.tile0.assign(b + 1, 0);
  for (int64_t i = 0; i < b; ++i) p.tile0[i + 1] = p.tile0[i] + (koff[i + 1] - koff[i] + BK - 1) / BK;
  const int64_t tiles = p.tile0[b];
  if (tile_of && n_tile_ids != tiles) return "tile_ids needs one id per 64-key tile";
  p.tile_seq.resize(tiles);
  for (int64_t i = 0; i < b; ++i)
    std::fill(p.tile_seq.begin() + p.tile0[i], p.tile_seq.begin() + p.tile0[i + 1], i);
  p.first.clear();
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t id = tile_of ? tile_of[t] : t;
    if (id < 0 || id > p.distinct()) return "tile_ids must number tiles 0, 1, ...";
    if (id == p.distinct()) p.first.push_back(t);
  }
  return nullptr;
}

// f(c, h, key0, cols) for every (key/value head h, distinct tile) c = h * distinct + tile,
// in parallel: the tile's keys are the logical keys key0 .. key0 + cols - 1 (cols <= BK).
template <class F>
void for_each_tile(const Plan& p, const int64_t* koff, int64_t hkv, int threads, F f) {
  const int64_t distinct = p.distinct();
#pragma omp parallel for num_threads(threads) schedule(dynamic)
  for (int64_t c = 0; c < hkv * distinct; ++c) {
    const int64_t t = p.first[c % distinct], seq = p.tile_seq[t];
    const int64_t j0 = (t - p.tile0[seq]) * BK;
    f(c, c / distinct, koff[seq] + j0, std::min<int64_t>(BK, koff[seq + 1] - koff[seq] - j0));
  }
}

// f(seq, head, scratch) for every (sequence, query head) with queries, in parallel; the
// costliest sequences first, handed out one at a time, so the threads finish together.
// Each thread owns one Scratch.
template <class Scratch, class F>
void for_each_item(const int64_t* qoff, const int64_t* koff, int64_t b, int64_t hq,
                   int threads, F f) {
  std::vector<int64_t> order(b);
  for (int64_t i = 0; i < b; ++i) order[i] = i;
  auto cost = [&](int64_t i) { return (qoff[i + 1] - qoff[i]) * (koff[i + 1] - koff[i]); };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return cost(x) > cost(y); });
  const int64_t items = b * hq;
  std::atomic<int64_t> next{0};
  const int team = (int)std::min<int64_t>(threads, std::max<int64_t>(items, 1));
#pragma omp parallel num_threads(team)
  {
    Scratch sc;
    for (int64_t it; (it = next.fetch_add(1)) < items;) {
      const int64_t seq = order[it / hq];
      if (qoff[seq + 1] > qoff[seq]) f(seq, it % hq, sc);
    }
  }
}

}  // namespace varlen
