// When a request's decode steps move from the prefill worker to a decode
// worker. Splitting prefill from decode pays only for long outputs, so the
// split is gated on output length and binds late:
//
//   - off (no threshold, or no decode worker): everything stays colocated;
//   - max_tokens below the threshold: never moves;
//   - known long up front (the client's expected_output_tokens, the learned
//     length of its workload tag, or max_tokens when the operator opts in):
//     handed off right after its prefill;
//   - otherwise: handed off when its generated length reaches the threshold.
//
// Threshold 0 disaggregates everything.
//
// Thread safety: none; owned by the scheduler thread.
#ifndef TANDEM_SCHEDULER_DISAGGREGATION_POLICY_H_
#define TANDEM_SCHEDULER_DISAGGREGATION_POLICY_H_

#include <cstdint>
#include <optional>

#include "scheduler/output_length_estimator.h"
#include "scheduler/request.h"

namespace tandem::scheduler {

struct DisaggregationOptions {
  std::optional<int32_t> output_threshold;  // nullopt: off
  bool use_max_tokens = false;              // treat max_tokens as the expected length
  // The SLO policy chooses paths (SchedulerCore): enabled without a threshold.
  bool slo = false;
};

// The decision taken at admission.
struct AdmissionDecision {
  bool hand_off_after_prefill = false;
  bool may_hand_off_later = false;  // when the output reaches the threshold
  PathReason reason = PathReason::kDisaggregationOff;
};

// What the `auto` threshold is set from, measured at start-up on shared
// compute (milliseconds):
//   decode_pass       a batch-1 decode step alone: the decode worker's own
//                     pass over the weights;
//   chunk_step        a step of one prompt chunk (--max_batched_tokens);
//   chunk_with_decode the same chunk with one decode token riding along.
struct DisaggregationCosts {
  double decode_pass = 0;
  double chunk_step = 0;
  double chunk_with_decode = 0;
};

// The output length from which moving a request to the decode worker pays,
// or nullopt (off) when it never does.
//
// A colocated decode token whose step carries a prompt chunk waits for the
// whole mixed step instead of a decode step: interference
//   I = chunk_with_decode - decode_pass per token.
// A disaggregated token is computed in a pass of its own instead of riding
// along: extra compute
//   P = decode_pass - (chunk_with_decode - chunk_step) per token.
// The move itself costs about one decode step once (the request sits out one
// step between the lanes): H = decode_pass. While prompts keep arriving (the
// only time the choice matters), a request that produces L tokens after the
// move gains L * (I - P) - H, which is positive from L > H / (I - P). So the
// threshold is ceil(H / (I - P)), at least 1, and off when I <= P (hardware
// on which a chunk barely slows a decode step: a GPU at small chunks).
std::optional<int32_t> AutoOutputThreshold(const DisaggregationCosts& costs);

class DisaggregationPolicy {
 public:
  // `enabled` is false when there is no decode worker to hand off to.
  DisaggregationPolicy(DisaggregationOptions options, bool enabled);

  bool enabled() const { return enabled_; }
  std::optional<int32_t> threshold() const { return options_.output_threshold; }

  AdmissionDecision Admit(const Request& request) const;
  // Whether a colocated request that may hand off later should now.
  bool ReachedThreshold(int32_t generated) const;

  // Learns from a finished request (by stop or length).
  void Record(const Request& request, int32_t generated);
  // The learned output length of a workload tag, once known.
  std::optional<int32_t> EstimateOutput(const std::string& workload) const {
    return estimator_.Estimate(workload);
  }

 private:
  DisaggregationOptions options_;
  bool enabled_;
  OutputLengthEstimator estimator_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_DISAGGREGATION_POLICY_H_
