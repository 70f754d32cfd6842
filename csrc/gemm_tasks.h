// How the C++ GEMMs (int8_gemm_*.cpp, f32_gemm.cpp) split their output among OpenMP
// threads: tasks of a row panel x a run of column blocks, taken dynamically.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace gemm_tasks {

// fn(r0, r1, b0, b1) over the tasks of panel_rows rows x panel_blocks blocks that cover m
// rows x `blocks` blocks, spread over `threads`. Dynamic, so that on a machine shared with
// other processes a thread that loses its core takes fewer tasks, not holding up the rest
// (the tasks are large: an atomic increment each costs nothing).
template <class Fn>
void for_each_panel(int64_t m, int64_t blocks, int64_t panel_rows, int64_t panel_blocks,
                    int threads, Fn fn) {
  const int64_t row_panels = (m + panel_rows - 1) / panel_rows;
  const int64_t col_panels = (blocks + panel_blocks - 1) / panel_blocks;
#pragma omp parallel for num_threads(std::max(threads, 1)) schedule(dynamic)
  for (int64_t task = 0; task < row_panels * col_panels; ++task) {
    const int64_t r0 = task / col_panels * panel_rows, b0 = task % col_panels * panel_blocks;
    fn(r0, std::min(m, r0 + panel_rows), b0, std::min(blocks, b0 + panel_blocks));
  }
}

// Blocks per task: all of them (whole rows, so a task can norm and quantize its rows),
// unless the row panels of panel_rows alone leave a thread fewer than 4 tasks; then fewer,
// in whole units of `unit` blocks (a kernel's register tile).
inline int64_t task_blocks(int64_t m, int64_t blocks, int64_t panel_rows, int64_t unit,
                           int threads) {
  constexpr int64_t kTasksPerThread = 4;
  const int64_t row_panels = (m + panel_rows - 1) / panel_rows;
  const int64_t units = (blocks + unit - 1) / unit;
  const int64_t wanted = kTasksPerThread * threads;
  const int64_t split = std::min(units, (wanted + row_panels - 1) / row_panels);
  return (units + split - 1) / split * unit;
}

}  // namespace gemm_tasks
