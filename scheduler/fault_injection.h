// Faults injected into a worker's steps, for testing that the daemon
// survives them (--inject_fault; never set in production):
//   error@N        step N returns an INTERNAL error
//   throw@N        step N throws (the worker thread turns it into an error)
//   stall@N:DUR    step N sleeps DUR before running (the stall detector's
//                  case: health turns NOT_SERVING, then back)
// N counts the worker's steps from 1. A spec names the lane:
// "prefill:error@3" or "decode:stall@2:3s". On a decode daemon,
// "kv_transfer:error@N" makes its Nth KV transfer from a prefill daemon
// fail half way, and "kv_transfer:stall@N:DUR" read from a source that
// answers nothing for DUR (server/peer_service.h).
#ifndef TANDEM_SCHEDULER_FAULT_INJECTION_H_
#define TANDEM_SCHEDULER_FAULT_INJECTION_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/step/step_plan.h"

namespace tandem::scheduler {

struct FaultSpec {
  // kOverread: a decode daemon's KV transfer also asks for a block it was
  // not offered (lane kv_transfer only).
  enum class Kind { kError, kThrow, kStall, kOverread };
  std::string lane;  // "prefill", "decode" or "kv_transfer"
  Kind kind = Kind::kError;
  int64_t step = 1;
  absl::Duration stall;
};

// Parses "LANE:KIND@STEP[:DURATION]"; errors name what is wrong.
absl::StatusOr<FaultSpec> ParseFaultSpec(std::string_view text);

// Runs `inner`'s steps, injecting the fault at its step.
class FaultInjectingWorker final : public step::Worker {
 public:
  FaultInjectingWorker(step::Worker* inner, FaultSpec spec) : inner_(inner), spec_(spec) {}

  void OnThreadStart() override { inner_->OnThreadStart(); }
  step::StepResult Execute(const step::StepPlan& plan) override;

 private:
  step::Worker* inner_;
  const FaultSpec spec_;
  std::atomic<int64_t> steps_{0};
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_FAULT_INJECTION_H_
