// How the C++ GEMMs (int8_gemm_*.cpp, f32_gemm.cpp) split their output among OpenMP
// threads: tasks of a row panel x a run of column blocks, taken dynamically.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace gemm_tasks {

// Blocks per task: all of them (whole rows, so a task can norm and quantize its rows),
// unless `row_panels` alone leave a thread fewer than 4 tasks; then fewer, in whole units
// of `unit` blocks (a kernel's register tile).
inline int64_t blocks_per_task(int64_t row_panels, int64_t blocks, int64_t unit,
                               int threads) {
  constexpr int64_t kTasksPerThread = 4;
  const int64_t units = (blocks + unit - 1) / unit;
  const int64_t wanted = kTasksPerThread * threads;
  const int64_t split = std::min(units, (wanted + row_panels - 1) / row_panels);
  return (units + split - 1) / split * unit;
}

// m rows in `count` panels of whole register tiles (tile_rows), as even as whole tiles
// allow. With panels of a fixed size, 1024 rows made 11 panels of 96 and one thread took 6
// of them, the other 5: the GEMM ran 9% below what two threads give.
struct RowSplit {
  int64_t m, tile_rows, tiles, count;

  // At least ceil(m / max_rows) panels (max_rows a multiple of tile_rows), rounded up to a
  // multiple of `threads` while tiles remain to split.
  static RowSplit balanced(int64_t m, int64_t max_rows, int64_t tile_rows, int threads) {
    const int64_t tiles = (m + tile_rows - 1) / tile_rows, per = max_rows / tile_rows;
    const int64_t fewest = std::max<int64_t>((tiles + per - 1) / per, 1);
    const int64_t even = (fewest + threads - 1) / threads * threads;
    return {m, tile_rows, tiles, std::max(fewest, std::min(even, tiles))};
  }
  // Panels of exactly panel_rows (the last one shorter).
  static RowSplit fixed(int64_t m, int64_t panel_rows) {
    const int64_t panels = (m + panel_rows - 1) / panel_rows;
    return {m, panel_rows, panels, panels};
  }
  int64_t start(int64_t panel) const { return std::min(m, panel * tiles / count * tile_rows); }
};

// fn(r0, r1, b0, b1) over rows' panels x runs of panel_blocks blocks, spread over
// `threads`, a run's panels one after another (the threads share its weights in L3).
// Dynamic, so that on a machine shared with other processes a thread that loses its core
// takes fewer tasks, not holding up the rest (the tasks are large: an atomic increment each
// costs nothing).
template <class Fn>
void for_each_task(const RowSplit& rows, int64_t blocks, int64_t panel_blocks, int threads,
                   Fn fn) {
  const int64_t col_panels = (blocks + panel_blocks - 1) / panel_blocks;
#pragma omp parallel for num_threads(std::max(threads, 1)) schedule(dynamic)
  for (int64_t task = 0; task < rows.count * col_panels; ++task) {
    const int64_t panel = task % rows.count, b0 = task / rows.count * panel_blocks;
    const int64_t r0 = rows.start(panel), r1 = rows.start(panel + 1);
    if (r0 < r1) fn(r0, r1, b0, std::min(blocks, b0 + panel_blocks));
  }
}

}  // namespace gemm_tasks
