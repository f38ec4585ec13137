// The median of timings: the figure every start-up measurement and
// benchmark here reports, since single runs on a shared machine swing by tens
// of percent while the middle of several barely moves.
#ifndef TANDEM_COMMON_MEDIAN_H_
#define TANDEM_COMMON_MEDIAN_H_

#include <algorithm>
#include <vector>

namespace tandem {

// The middle value of `values`, or the mean of the middle two when their
// count is even; 0 for none.
inline double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t half = values.size() / 2;
  return values.size() % 2 == 1 ? values[half] : (values[half - 1] + values[half]) / 2;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_MEDIAN_H_
