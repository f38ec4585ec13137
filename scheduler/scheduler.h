// The scheduler thread: it owns a SchedulerCore, takes requests and
// cancellations from any thread through a short-locked inbox, and keeps each
// worker busy: whenever a worker is idle it gets its lane's next step, runs
// it on its own thread (WorkerThread), and its results come back through the
// inbox. So the prefill and decode workers run concurrently, one step in
// flight each. On shared compute the decode lane's steps go first; while the
// prefill lane is busy they are held back to their streams' slack, and
// prompt steps are sized to it (scheduler/step_dispatcher.h).
//
// Thread safety: Submit(), Cancel() and Load() may be called from any thread.
// RequestSinks are called on the scheduler thread only.
#ifndef TANDEM_SCHEDULER_SCHEDULER_H_
#define TANDEM_SCHEDULER_SCHEDULER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/step/step_plan.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/step_dispatcher.h"
#include "scheduler/worker_thread.h"

namespace tandem::scheduler {

// A consistent snapshot for load reporting (GetLoad, metrics).
struct SchedulerLoad {
  int32_t waiting = 0;
  std::array<int32_t, kLanes> running = {0, 0};
  int32_t running_remote = 0;  // handed to decode daemons, not yet ended
  int64_t preemptions = 0;
  int64_t handoffs = 0;
  int64_t lease_expirations = 0;  // remote decode leases that ran out
  kvcache::KvCacheStats kv;
  // For stall detection: when a step last completed, and whether any
  // request is waiting or running.
  absl::Time last_step_done = absl::InfinitePast();
  bool has_work = false;
  // The SLO policy's view: the least TPOT slack of the streams decoding
  // here, in ms (nullopt: none), the prompt tokens admitted and not yet
  // computed, the rate a prompt is computed at now (tokens per ms, from the
  // step-time model: full chunks), and the model itself.
  std::optional<double> least_slack_ms;
  int64_t running_prompt_tokens = 0;
  double prompt_tokens_per_ms = 0;
  StepTimeCoefficients step_time;
  double step_time_error = 0;  // its mean relative error on recent steps
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
  // What the step-time model predicted for it at dispatch, and the compute
  // it had (duration less start_delay and yielded).
  absl::Duration predicted;
  absl::Duration compute;
  // Speculative decoding: one entry per sequence that verified drafts.
  struct Verification {
    step::Proposer proposer = step::Proposer::kNone;
    step::DraftSource source = step::DraftSource::kRequest;
    int32_t drafted = 0;
    int32_t accepted = 0;
  };
  std::vector<Verification> verifications;
};
using StepObserver = std::function<void(const StepStats&)>;

// Where a prefill daemon's scheduler sends the requests it hands to decode
// daemons, and the aborts of those that ended here first
// (server/remote_decoder.h). Called on the scheduler thread: must not block.
// The link reports back through the Scheduler's Remote* and CommitLease.
class RemoteDecodeLink {
 public:
  virtual ~RemoteDecodeLink() = default;
  virtual void Offer(HandoffOffer offer) = 0;
  virtual void Abort(uint64_t sequence_id) = 0;
  // The offer's lease ended (its pages were read and released, it expired,
  // or the request ended or went on here). Called on the scheduler thread
  // before the offer's blocks go to anything else: whatever lets the peer
  // read them must stop when this returns.
  virtual void LeaseEnded(uint64_t /*sequence_id*/) {}
};

// Copies pages from the prefill lane's KV storage to the decode lane's when
// the two are separate (SchedulerOptions::decode_kv_blocks;
// server/lane_kv_mover.h). Called on the scheduler thread: must not block;
// reports each move's end through Scheduler::CompleteMove.
class BlockMover {
 public:
  virtual ~BlockMover() = default;
  virtual void Move(BlockMove move) = 0;
};

class Scheduler {
 public:
  // Workers must outlive the scheduler; `decode` may be null (no decode
  // worker: everything runs colocated on `prefill`). `max_queued` bounds
  // requests that are submitted but not yet running. `dispatch`: how decode
  // steps are held back while a prefill step runs on shared compute and how
  // large prompt steps are (scheduler/step_dispatcher.h). With
  // `admission_by_slo` (--admission=slo) a request whose predicted TTFT
  // passes its budget is refused at once (ResourceExhausted).
  Scheduler(SchedulerOptions options, int32_t max_queued, step::Worker* prefill,
            step::Worker* decode = nullptr, StepObserver observer = nullptr,
            DispatchOptions dispatch = {}, bool admission_by_slo = false);
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

  // The fitted step-time formula and its recent error (for logs and
  // GetModelInfo), and the output length from which a lone stream would be
  // disaggregated at the load now (nullopt: none would). Any thread; waits
  // for the scheduler thread.
  struct PolicyReport {
    std::string step_time;
    std::optional<int32_t> crossover_tokens;
  };
  PolicyReport ReportPolicy();
  // Starts the step-time model from a start-up measurement (it then learns
  // from the steps that run). Any thread; takes effect before requests
  // submitted after it.
  void CalibrateStepTime(StepTimeCoefficients prior);
  // Remote decode under the SLO policy: the decode peers' load
  // (SchedulerCore::SetPeerLoad); any thread.
  void SetPeerLoad(int32_t decoding, std::optional<double> least_slack_ms);

  // --- remote decode, a prefill daemon (SchedulerCore's file comment) ---
  // REQUIRES: called before the first Submit(), with options.remote_decode.
  // Without a link, requests due for a decode daemon go on here.
  void SetRemoteDecodeLink(RemoteDecodeLink* link);
  // What the decode daemon reported for a request it took over.
  void RemoteTokens(uint64_t sequence_id, std::vector<TokenId> tokens,
                    std::vector<step::TokenLogprobs> logprobs);
  void RemoteFinished(uint64_t sequence_id, FinishReason reason, int32_t drafted, int32_t accepted);
  void RemoteFailed(uint64_t sequence_id);
  // The decode daemon has read the pages: `answer(true)` once they are
  // released, `answer(false)` when the lease expired first (or the request
  // ended): the decode daemon must not use them. Called on the scheduler
  // thread.
  void CommitLease(uint64_t sequence_id, std::function<void(bool)> answer);

  // --- separate KV storages for the two lanes ---
  // REQUIRES: called before the first Submit(), with options.decode_kv_blocks.
  // Without a mover every handoff stays colocated.
  void SetBlockMover(BlockMover* mover);
  void CompleteMove(uint64_t sequence_id, absl::Status status);

  // --- remote decode, a decode daemon ---
  // Takes a request over from a prefill daemon: returns its sequence id at
  // once (for Cancel and CompleteImport); `reserved` is then called on the
  // scheduler thread with the block table its pages go to, or the reason it
  // cannot run here (the request is gone then: its sink hears nothing).
  using ImportCallback = std::function<void(absl::StatusOr<std::vector<int32_t>>)>;
  absl::StatusOr<uint64_t> Import(ImportedRequest imported, ImportCallback reserved);
  // The transfer into its blocks ended (SchedulerCore::CompleteImport).
  void CompleteImport(uint64_t sequence_id, absl::Status status);

 private:
  struct Command {
    uint64_t id = 0;
    std::optional<Request> request;  // empty: a cancellation, unless `action`
    std::function<void()> action;    // run on the scheduler thread, in order
  };
  // Queues `action` for the scheduler thread.
  void Post(std::function<void()> action);
  // Hands the core's offers and aborts to the remote-decode link, and its
  // page moves to the block mover.
  void DeliverRemote();
  struct Completion {
    Lane lane;
    step::StepResult result;
  };
  struct LaneState {
    std::unique_ptr<WorkerThread> thread;  // null: no worker for this lane
    bool busy = false;
    step::StepPlan plan;  // the step in flight
    absl::Time started;
    double predicted_ms = 0;  // the step-time model's prediction at dispatch
  };
  void Loop();
  bool AnyBusy() const;
  // Copies the core's counts into load_ for Load().
  void PublishLoad();
  // Calls the OnFinish calls held back until after PublishLoad().
  void DeliverHeldFinishes();
  // Hands the round's prefix-index events to SchedulerOptions::on_kv_events.
  void PublishKvEvents();

  const int32_t max_queued_;
  const int64_t max_queued_tokens_;
  const bool admission_by_slo_;
  const LatencyBudget default_slo_;
  StepObserver observer_;
  // SchedulerOptions::on_kv_events (set before core_ takes the options).
  const std::function<bool(std::vector<kvcache::KvEvent>)> kv_events_;
  bool kv_events_resync_ = false;        // scheduler thread only
  SchedulerCore core_;                   // scheduler thread only
  StepDispatcher dispatcher_;            // scheduler thread only
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
  PathLoad path_load_ ABSL_GUARDED_BY(mu_);  // for ReportPolicy
  RemoteDecodeLink* remote_link_ = nullptr;  // set before the first request
  BlockMover* block_mover_ = nullptr;        // ditto
  std::thread thread_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SCHEDULER_H_
