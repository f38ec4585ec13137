// Learns, per workload tag, how many tokens requests generate, from the
// requests that finished (by a stop or by their length limit): the median of
// the last kWindow. A tag has an estimate once it has kMinSamples.
//
// Thread safety: none; owned by the scheduler thread.
#ifndef TANDEM_SCHEDULER_OUTPUT_LENGTH_ESTIMATOR_H_
#define TANDEM_SCHEDULER_OUTPUT_LENGTH_ESTIMATOR_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"

namespace tandem::scheduler {

class OutputLengthEstimator {
 public:
  static constexpr size_t kWindow = 64;
  static constexpr size_t kMinSamples = 8;
  static constexpr size_t kMaxWorkloads = 1024;  // tags beyond this are not learned

  void Record(const std::string& workload, int32_t generated_tokens);
  std::optional<int32_t> Estimate(const std::string& workload) const;

 private:
  absl::flat_hash_map<std::string, std::deque<int32_t>> samples_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_OUTPUT_LENGTH_ESTIMATOR_H_
