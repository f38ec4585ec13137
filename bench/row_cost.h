// Shared by the kernel benchmarks that price a step by its rows
// (tandem-attention-bench, tandem-matmul-bench): the median time of a call,
// and the line that sets it against the one-row time.
#ifndef TANDEM_BENCH_ROW_COST_H_
#define TANDEM_BENCH_ROW_COST_H_

#include <chrono>
#include <cstdio>
#include <utility>
#include <vector>

#include "common/median.h"

namespace tandem::bench {

// The median wall milliseconds of `repeats` calls of fn().
template <typename Fn>
double MedianMs(int repeats, Fn&& fn) {
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  return Median(std::move(ms));
}

// Prints "rows, ms, ms / one_row_ms, ms per row beyond the first" (the
// last two 0 until the one-row time is known), without a line end.
inline void PrintRowCost(long long rows, double ms, double one_row_ms) {
  std::printf("%5lld %10.3f %8.2fx %14.3f", rows, ms, one_row_ms > 0 ? ms / one_row_ms : 0.0,
              rows > 1 && one_row_ms > 0 ? (ms - one_row_ms) / static_cast<double>(rows - 1) : 0.0);
}

}  // namespace tandem::bench

#endif  // TANDEM_BENCH_ROW_COST_H_
