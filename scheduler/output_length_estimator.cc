#include "scheduler/output_length_estimator.h"

#include <algorithm>
#include <vector>

namespace tandem::scheduler {

void OutputLengthEstimator::Record(const std::string& workload, int32_t generated_tokens) {
  if (workload.empty()) return;
  auto it = samples_.find(workload);
  if (it == samples_.end()) {
    if (samples_.size() >= kMaxWorkloads) return;
    it = samples_.emplace(workload, std::deque<int32_t>()).first;
  }
  it->second.push_back(generated_tokens);
  if (it->second.size() > kWindow) it->second.pop_front();
}

std::optional<int32_t> OutputLengthEstimator::Estimate(const std::string& workload) const {
  auto it = samples_.find(workload);
  if (it == samples_.end() || it->second.size() < kMinSamples) return std::nullopt;
  std::vector<int32_t> sorted(it->second.begin(), it->second.end());
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<long>(sorted.size() / 2),
                   sorted.end());
  return sorted[sorted.size() / 2];
}

}  // namespace tandem::scheduler
