#include "scheduler/disaggregation_policy.h"

#include <algorithm>
#include <cmath>

namespace tandem::scheduler {

std::optional<int32_t> AutoOutputThreshold(const DisaggregationCosts& costs) {
  const double interference = costs.chunk_with_decode - costs.decode_pass;
  const double extra_pass = costs.decode_pass - (costs.chunk_with_decode - costs.chunk_step);
  const double gain = interference - extra_pass;
  if (!(gain > 0) || !(costs.decode_pass > 0)) return std::nullopt;
  const double tokens = std::ceil(costs.decode_pass / gain);
  return static_cast<int32_t>(std::clamp(tokens, 1.0, 1e6));
}

DisaggregationPolicy::DisaggregationPolicy(DisaggregationOptions options, bool enabled)
    : options_(options),
      enabled_(enabled && (options.output_threshold.has_value() || options.slo)) {}

AdmissionDecision DisaggregationPolicy::Admit(const Request& request) const {
  AdmissionDecision d;
  if (!enabled_ || !options_.output_threshold.has_value()) return d;  // kDisaggregationOff
  const int32_t threshold = *options_.output_threshold;
  if (request.max_tokens < threshold) {
    d.reason = PathReason::kBelowThreshold;
    return d;
  }
  d.hand_off_after_prefill = true;
  if (request.expected_output_tokens > 0 && request.expected_output_tokens >= threshold) {
    d.reason = PathReason::kExpectedOutputHint;
    return d;
  }
  if (const std::optional<int32_t> estimate = estimator_.Estimate(request.workload);
      estimate.has_value() && *estimate >= threshold) {
    d.reason = PathReason::kWorkloadEstimate;
    return d;
  }
  if (options_.use_max_tokens) {
    d.reason = PathReason::kMaxTokens;
    return d;
  }
  if (threshold == 0) {
    d.reason = PathReason::kThresholdReached;
    return d;
  }
  d.hand_off_after_prefill = false;
  d.may_hand_off_later = true;
  d.reason = PathReason::kBelowThreshold;  // until the output reaches the threshold
  return d;
}

bool DisaggregationPolicy::ReachedThreshold(int32_t generated) const {
  return enabled_ && options_.output_threshold.has_value() &&
         generated >= *options_.output_threshold;
}

void DisaggregationPolicy::Record(const Request& request, int32_t generated) {
  estimator_.Record(request.workload, generated);
}

}  // namespace tandem::scheduler
