// The rule that picks each lane's next step: which lane runs, when the
// decode lane's step may start, and how many tokens a prefill step takes.
// The Scheduler's loop and the discrete-event simulation in the tests
// (tests/unit/shared_compute_test.cc) both call this class, so what the
// tests check is what the daemon does.
//
// Two policies:
//
// kSlo (--policy=slo, the default): from the streams' TPOT slack
// (SchedulerCore::LeastSlackMs) and the step-time model
// (scheduler/step_time_model.h).
//   - The decode lane, while the prefill lane is busy on the same compute,
//     starts its step when its streams' least slack comes within the
//     predicted step time (with a lead of a quarter of it plus
//     start_latency, for the start and the model's error); until then the
//     compute stays with the prompts. So a loose TPOT budget leaves the
//     prompts nearly all of it (colocated serving's TTFT), a tight one
//     steps every stream as soon as it is due (strict decode-first). While
//     the prompts due first would miss their TTFT with the decode lane's
//     share taken but not without it, the streams' deadlines relax to what
//     their whole budget allows (SchedulerCore::LeastSlackMs, relaxed): they
//     lend the prompts their margin and their lead, never more. An idle
//     prefill lane holds nothing back.
//   - A prefill-lane step carrying colocated decodes takes the largest
//     prompt chunk whose predicted step fits those streams' least slack
//     (Sarathi-Serve's budget), at least min_prompt_chunk tokens: a prompt
//     of P tokens at the head of the queue is done within
//     ceil(P / min_prompt_chunk) prefill steps, whatever the slack. When
//     even the least chunk's step is past the streams' least slack
//     (overload: they miss their budget whatever the size), the step keeps
//     the least chunk, so their stalls stay as short as they can be. When
//     the prompts due first (of those that can still make their TTFT)
//     would miss it at the chosen size but make it at full size, the step
//     is full-size.
//   - Waiting prompts are admitted earliest TTFT deadline first
//     (SchedulerCore), and each request's path is weighed against its budget
//     (scheduler/slo_path.h).
//
// kPaced (--policy=threshold): the fixed pacing of DecodePacer
// (--decode_step_interval, --prefill_min_share) and full-size prompt steps.
//
// Every step that ends is fed to the step-time model (OnEnd), under either
// policy, so its error is reported either way.
//
// Thread safety: none; owned by the scheduler thread (or a test).
#ifndef TANDEM_SCHEDULER_STEP_DISPATCHER_H_
#define TANDEM_SCHEDULER_STEP_DISPATCHER_H_

#include "absl/time/time.h"
#include "engine/step/step_plan.h"
#include "scheduler/decode_pacer.h"
#include "scheduler/scheduler_core.h"

namespace tandem::scheduler {

enum class DispatchPolicy : uint8_t { kSlo, kPaced };

struct DispatchOptions {
  // The daemon's default is kSlo (server/daemon_options.h); a bare
  // Scheduler (tests) paces as --policy=threshold does.
  DispatchPolicy policy = DispatchPolicy::kPaced;
  // kPaced: the fixed pacing ({0, 0}: none).
  DecodePacingOptions pacing;
  // The two lanes compute on one pool; false when the decode lane has
  // threads of its own (nothing to hold back then).
  bool shared_compute = true;
  // kSlo: how long a released decode step takes to get the compute (one
  // task of the compute pool) and be dispatched; it starts this much early.
  absl::Duration start_latency = absl::Milliseconds(1);
};

class StepDispatcher {
 public:
  // `core` must outlive the dispatcher.
  StepDispatcher(DispatchOptions options, SchedulerCore* core);

  // The next step for `lane`, which is idle; empty when it has nothing to
  // run now, or (the decode lane) when its step is held back: NextWake()
  // says until when. `prefill_busy`: a prefill-lane step is in flight.
  step::StepPlan Next(Lane lane, absl::Time now, bool prefill_busy);
  // When a held decode step may go (InfiniteFuture when none is held).
  absl::Time NextWake() const { return wake_; }

  // A step of `lane` ended at `now`; `compute` is the time it had the
  // compute (its duration less its wait and what it yielded to the other
  // lane). Learns its time.
  void OnEnd(Lane lane, const step::StepPlan& plan, const step::StepResult& result, absl::Time now,
             absl::Duration compute);

  // The token budget of the prefill lane's next step (kSlo).
  int32_t PromptStepBudget(absl::Time now) const;

  DispatchPolicy policy() const { return options_.policy; }

 private:
  // kSlo: whether the decode lane's step may start now; else sets wake_.
  bool DecodeDue(absl::Time now);
  // Whether the prompts due first for their TTFT would make it with all the
  // compute but not with `decode_share` of it taken by the decode lane.
  bool PromptsPressed(absl::Time now, double decode_share) const;

  DispatchOptions options_;
  SchedulerCore* core_;
  DecodePacer pacer_;
  absl::Time wake_ = absl::InfiniteFuture();
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_STEP_DISPATCHER_H_
