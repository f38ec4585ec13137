// The scheduler thread: it owns a SchedulerCore, takes requests and
// cancellations from any thread through a short-locked inbox, and keeps each
// worker busy: whenever a worker is idle it gets its lane's next step, runs
// it on its own thread (WorkerThread), and its results come back through the
// inbox. So the prefill and decode workers run concurrently, one step in
// flight each. On shared compute the decode lane's steps go first; while the
// prefill lane is busy they are paced (scheduler/decode_pacer.h).
//
// Thread safety: Submit(), Cancel() and Load() may be called from any thread.
// RequestSinks are called on the scheduler thread only.
#ifndef TANDEM_SCHEDULER_SCHEDULER_H_
#define TANDEM_SCHEDULER_SCHEDULER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/step/step_plan.h"
#include "scheduler/decode_pacer.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/worker_thread.h"

namespace tandem::scheduler {

// A consistent snapshot for load reporting (GetLoad, metrics).
struct SchedulerLoad {
  int32_t waiting = 0;
  std::array<int32_t, kLanes> running = {0, 0};
  int64_t preemptions = 0;
  int64_t handoffs = 0;
  kvcache::KvCacheStats kv;
  // For stall detection: when a step last completed, and whether any
  // request is waiting or running.
  absl::Time last_step_done = absl::InfinitePast();
  bool has_work = false;
};

// Whether the scheduler looks stuck: requests are pending but no step has
// completed for `timeout` (a hung worker, a deadlock). Health reports
// NOT_SERVING while this holds.
bool Stalled(const SchedulerLoad& load, absl::Time now, absl::Duration timeout);

// What a worker's step was, for metrics: called on the scheduler thread
// when the step's results arrive.
struct StepStats {
  Lane lane = Lane::kPrefill;
  int64_t tokens = 0;  // planned tokens, drafts not included
  int32_t sequences = 0;
  absl::Duration duration;  // dispatch to results
  // Shared compute (step::StepResult): how long the step waited for it, and
  // how long it yielded it to the other lane.
  absl::Duration start_delay;
  absl::Duration yielded;
  // Speculative decoding: one entry per sequence that verified drafts.
  struct Verification {
    step::Proposer proposer = step::Proposer::kNone;
    int32_t drafted = 0;
    int32_t accepted = 0;
  };
  std::vector<Verification> verifications;
};
using StepObserver = std::function<void(const StepStats&)>;

class Scheduler {
 public:
  // Workers must outlive the scheduler; `decode` may be null (no decode
  // worker: everything runs colocated on `prefill`). `max_queued` bounds
  // requests that are submitted but not yet running. `pacing`: how decode
  // steps are held back while a prefill step runs on shared compute
  // (scheduler/decode_pacer.h; {0, 0} holds nothing back, for workers that
  // share no compute).
  Scheduler(SchedulerOptions options, int32_t max_queued, step::Worker* prefill,
            step::Worker* decode = nullptr, StepObserver observer = nullptr,
            DecodePacingOptions pacing = {});
  ~Scheduler();  // Stop()s
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. Returns its sequence id (for Cancel), or
  // InvalidArgument when it can never run, ResourceExhausted when the queue
  // is full, Unavailable once Stop() has begun. On error the sink is not
  // called.
  absl::StatusOr<uint64_t> Submit(Request request);

  // Ends the sequence at the next step boundary (FinishReason::kCancelled).
  void Cancel(uint64_t sequence_id);

  // Cancels everything still queued or running (steps in flight complete
  // first) and joins the threads.
  void Stop();

  SchedulerLoad Load() const;

 private:
  struct Command {
    uint64_t id = 0;
    std::optional<Request> request;  // empty: a cancellation
  };
  struct Completion {
    Lane lane;
    step::StepResult result;
  };
  struct LaneState {
    std::unique_ptr<WorkerThread> thread;  // null: no worker for this lane
    bool busy = false;
    step::StepPlan plan;  // the step in flight
    absl::Time started;
  };
  void Loop();
  bool AnyBusy() const;
  // Copies the core's counts into load_ for Load().
  void PublishLoad();
  // Calls the OnFinish calls held back until after PublishLoad().
  void DeliverHeldFinishes();

  const int32_t max_queued_;
  const int64_t max_queued_tokens_;
  StepObserver observer_;
  SchedulerCore core_;                   // scheduler thread only
  DecodePacer pacer_;                    // scheduler thread only
  std::array<LaneState, kLanes> lanes_;  // scheduler thread only (threads set at construction)
  // Finished requests whose sinks hear of it after the next PublishLoad().
  std::vector<std::pair<std::shared_ptr<RequestSink>, FinishInfo>> held_finishes_;  // ditto

  mutable absl::Mutex mu_;
  std::vector<Command> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<Completion> completions_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int32_t queued_ ABSL_GUARDED_BY(mu_) = 0;         // in the inbox or waiting in the core
  int64_t queued_tokens_ ABSL_GUARDED_BY(mu_) = 0;  // their prompt tokens
  SchedulerLoad load_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SCHEDULER_H_
