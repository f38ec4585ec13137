#include "scheduler/scheduler.h"

#include <cmath>

#include "common/strings.h"
#include "common/thread_name.h"

namespace tandem::scheduler {
namespace {

SchedulerOptions WithLanes(SchedulerOptions options, bool decode_worker) {
  options.decode_lane = decode_worker;
  return options;
}

// Holds a request's OnFinish until the scheduler has published the load
// snapshot that no longer counts the request, so a client that sees its call
// end and then asks GetLoad sees the blocks and the slot returned. Tokens pass
// straight through. Used on the scheduler thread only.
class FinishAfterPublishSink final : public RequestSink {
 public:
  FinishAfterPublishSink(std::shared_ptr<RequestSink> inner,
                         std::vector<std::pair<std::shared_ptr<RequestSink>, FinishInfo>>* held)
      : inner_(std::move(inner)), held_(held) {}
  bool OnToken(TokenId token, bool is_stop_token, const step::TokenLogprobs* logprobs) override {
    return inner_->OnToken(token, is_stop_token, logprobs);
  }
  void OnFinish(const FinishInfo& info) override { held_->emplace_back(inner_, info); }

 private:
  std::shared_ptr<RequestSink> inner_;
  std::vector<std::pair<std::shared_ptr<RequestSink>, FinishInfo>>* held_;
};

}  // namespace

bool Stalled(const SchedulerLoad& load, absl::Time now, absl::Duration timeout) {
  return load.has_work && now - load.last_step_done > timeout;
}

Scheduler::Scheduler(SchedulerOptions options, int32_t max_queued, step::Worker* prefill,
                     step::Worker* decode, StepObserver observer, DispatchOptions dispatch,
                     bool admission_by_slo)
    : max_queued_(max_queued),
      max_queued_tokens_(options.max_queued_tokens),
      admission_by_slo_(admission_by_slo),
      default_slo_(options.slo),
      observer_(std::move(observer)),
      kv_events_(options.on_kv_events),
      core_(WithLanes(std::move(options), decode != nullptr)),
      dispatcher_(dispatch, &core_) {
  step::Worker* workers[kLanes] = {prefill, decode};
  for (int lane = 0; lane < kLanes; ++lane) {
    if (workers[lane] == nullptr) continue;
    lanes_[static_cast<size_t>(lane)].thread = std::make_unique<WorkerThread>(
        static_cast<Lane>(lane) == Lane::kPrefill ? "tandem-prefill" : "tandem-decode",
        workers[lane], [this, lane](step::StepResult result) {
          absl::MutexLock lock(&mu_);
          completions_.push_back({static_cast<Lane>(lane), std::move(result)});
        });
  }
  {
    absl::MutexLock lock(&mu_);
    load_.kv = core_.kv_stats();
    load_.last_step_done = absl::Now();  // stall detection counts from the start
  }
  thread_ = std::thread([this] {
    NameThisThread("tandem-sched");
    Loop();
  });
}

Scheduler::~Scheduler() { Stop(); }

absl::StatusOr<uint64_t> Scheduler::Submit(Request request) {
  if (absl::Status s = core_.Admissible(request); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the server is shutting down");
  if (queued_ >= max_queued_) {
    return absl::ResourceExhaustedError(
        StrCat("the request queue is full (", max_queued_, " requests waiting)"));
  }
  const auto prompt = static_cast<int64_t>(request.prompt.size());
  if (max_queued_tokens_ > 0 && queued_ > 0 && queued_tokens_ + prompt > max_queued_tokens_) {
    return absl::ResourceExhaustedError(
        StrCat("the request queue is full (", queued_tokens_, " prompt tokens waiting; this ",
               prompt, "-token prompt would pass --max_queued_tokens=", max_queued_tokens_, ")"));
  }
  if (admission_by_slo_ && load_.prompt_tokens_per_ms > 0) {
    // Refused before any compute is spent: the prompts ahead of it and its
    // own at the rate prompts are computed now.
    const double predicted_ms =
        static_cast<double>(queued_tokens_ + load_.running_prompt_tokens + prompt) /
        load_.prompt_tokens_per_ms;
    const absl::Duration budget =
        request.slo.ttft > absl::ZeroDuration() ? request.slo.ttft : default_slo_.ttft;
    if (predicted_ms > absl::ToDoubleMilliseconds(budget)) {
      return absl::ResourceExhaustedError(
          StrCat("the predicted time to first token is ", static_cast<int64_t>(predicted_ms),
                 " ms, over the request's budget of ", absl::ToInt64Milliseconds(budget),
                 " ms (--admission=slo; ", queued_tokens_ + load_.running_prompt_tokens,
                 " prompt tokens are ahead of it)"));
    }
  }
  const uint64_t id = next_id_++;
  ++queued_;
  queued_tokens_ += prompt;
  request.sink = std::make_shared<FinishAfterPublishSink>(std::move(request.sink), &held_finishes_);
  inbox_.push_back({id, std::move(request), nullptr});
  return id;
}

void Scheduler::Cancel(uint64_t sequence_id) {
  absl::MutexLock lock(&mu_);
  inbox_.push_back({sequence_id, std::nullopt, nullptr});
}

void Scheduler::Post(std::function<void()> action) {
  absl::MutexLock lock(&mu_);
  Command command;
  command.action = std::move(action);
  inbox_.push_back(std::move(command));
}

void Scheduler::SetRemoteDecodeLink(RemoteDecodeLink* link) {
  remote_link_ = link;
  core_.SetLeaseEndHook([link](uint64_t sequence_id) {
    if (link != nullptr) link->LeaseEnded(sequence_id);
  });
}

void Scheduler::CalibrateStepTime(StepTimeCoefficients prior) {
  Post([this, prior] { core_.mutable_time_model().Reset(prior); });
}

void Scheduler::SetPeerLoad(int32_t decoding, std::optional<double> least_slack_ms) {
  Post([this, decoding, least_slack_ms] { core_.SetPeerLoad(decoding, least_slack_ms); });
}

Scheduler::PolicyReport Scheduler::ReportPolicy() {
  SchedulerLoad load;
  PathLoad path;
  {
    absl::MutexLock lock(&mu_);
    load = load_;
    path = path_load_;
  }
  // A model with the published coefficients and the row curve (set when the
  // core was made, never changed, so it is read here without the scheduler
  // thread) predicts as the scheduler's does.
  StepTimeModel model(load.step_time);
  model.SetRowCurve(core_.time_model().row_curve());
  PolicyReport report;
  report.step_time = DescribeStepTime(load.step_time, load.step_time_error);
  path.colocated_decodes = 0;  // a lone stream: the prompts stay as they are
  path.lane_decodes = 0;
  report.crossover_tokens = DisaggregationCrossover(model, path, default_slo_, 256);
  return report;
}

void Scheduler::SetBlockMover(BlockMover* mover) { block_mover_ = mover; }

void Scheduler::CompleteMove(uint64_t sequence_id, absl::Status status) {
  Post(
      [this, sequence_id, status = std::move(status)] { core_.CompleteMove(sequence_id, status); });
}

void Scheduler::RemoteTokens(uint64_t sequence_id, std::vector<TokenId> tokens,
                             std::vector<step::TokenLogprobs> logprobs) {
  Post([this, sequence_id, tokens = std::move(tokens), logprobs = std::move(logprobs)] {
    core_.OnRemoteTokens(sequence_id, tokens, logprobs);
  });
}

void Scheduler::RemoteFinished(uint64_t sequence_id, FinishReason reason, int32_t drafted,
                               int32_t accepted) {
  Post([this, sequence_id, reason, drafted, accepted] {
    core_.FinishRemote(sequence_id, reason, drafted, accepted);
  });
}

void Scheduler::RemoteFailed(uint64_t sequence_id) {
  Post([this, sequence_id] { core_.ResumeLocally(sequence_id); });
}

void Scheduler::CommitLease(uint64_t sequence_id, std::function<void(bool)> answer) {
  Post([this, sequence_id, answer = std::move(answer)] { answer(core_.CommitLease(sequence_id)); });
}

absl::StatusOr<uint64_t> Scheduler::Import(ImportedRequest imported, ImportCallback reserved) {
  imported.request.sink =
      std::make_shared<FinishAfterPublishSink>(std::move(imported.request.sink), &held_finishes_);
  // std::function needs a copyable callable: the request travels in a shared_ptr.
  auto shared = std::make_shared<ImportedRequest>(std::move(imported));
  // Checked and queued under one lock, so the loop cannot have made its
  // last pass in between (the callback would never run).
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the server is shutting down");
  const uint64_t id = next_id_++;
  Command command;
  command.action = [this, id, shared, reserved = std::move(reserved)] {
    reserved(core_.Import(id, std::move(*shared)));
  };
  inbox_.push_back(std::move(command));
  return id;
}

void Scheduler::CompleteImport(uint64_t sequence_id, absl::Status status) {
  Post([this, sequence_id, status = std::move(status)] {
    core_.CompleteImport(sequence_id, status);
  });
}

void Scheduler::DeliverRemote() {
  for (HandoffOffer& offer : core_.TakeOffers()) {
    // Its lease may have ended since it was queued (cancelled, a deadline):
    // its blocks may be another request's by now, so it is never offered.
    if (!core_.LeaseHeld(offer.sequence_id)) continue;
    if (remote_link_ == nullptr) {
      core_.ResumeLocally(offer.sequence_id);
    } else {
      remote_link_->Offer(std::move(offer));
    }
  }
  for (uint64_t id : core_.TakeRemoteAborts()) {
    if (remote_link_ != nullptr) remote_link_->Abort(id);
  }
  for (BlockMove& move : core_.TakeMoves()) {
    if (block_mover_ == nullptr) {
      core_.CompleteMove(move.sequence_id,
                         absl::FailedPreconditionError("no block mover for separate KV storages"));
    } else {
      block_mover_->Move(std::move(move));
    }
  }
}

void Scheduler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  for (LaneState& lane : lanes_) lane.thread.reset();
}

SchedulerLoad Scheduler::Load() const {
  absl::MutexLock lock(&mu_);
  return load_;
}

bool Scheduler::AnyBusy() const {
  for (const LaneState& lane : lanes_) {
    if (lane.busy) return true;
  }
  return false;
}

void Scheduler::Loop() {
  bool progressed = true;
  absl::Time held_decode_until = absl::InfiniteFuture();
  for (;;) {
    std::vector<Command> commands;
    std::vector<Completion> completions;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !inbox_.empty() || !completions_.empty();
      };
      // Sleep unless the last round changed something (then an idle worker
      // may have work now) or there is news; a paced decode step wakes us.
      if (!progressed) {
        mu_.AwaitWithDeadline(absl::Condition(&ready),
                              std::min(core_.NextDeadline(), held_decode_until));
      }
      commands.swap(inbox_);
      completions.swap(completions_);
      stopping = stopping_;
    }
    progressed = !completions.empty() || !commands.empty();
    if (!completions.empty()) {
      absl::MutexLock lock(&mu_);
      load_.last_step_done = absl::Now();
    }
    for (Completion& c : completions) {
      LaneState& lane = lanes_[static_cast<size_t>(c.lane)];
      const absl::Time done = absl::Now();
      const absl::Duration compute =
          (done - lane.started) - c.result.start_delay - c.result.yielded;
      dispatcher_.OnEnd(c.lane, lane.plan, c.result, done, compute);
      if (observer_) {
        StepStats stats;
        stats.lane = c.lane;
        stats.tokens = lane.plan.TokenCount();
        stats.sequences = static_cast<int32_t>(lane.plan.sequences.size());
        stats.duration = done - lane.started;
        stats.start_delay = c.result.start_delay;
        stats.yielded = c.result.yielded;
        stats.predicted = absl::Microseconds(static_cast<int64_t>(lane.predicted_ms * 1000.0));
        stats.compute = compute;
        for (const step::SequenceResult& r : c.result.sequences) {
          if (r.drafted > 0)
            stats.verifications.push_back({r.proposer, r.draft_source, r.drafted, r.accepted});
        }
        observer_(stats);
      }
      core_.Update(c.lane, lane.plan, c.result);
      lane.busy = false;
      lane.plan = {};
    }
    for (Command& c : commands) {
      if (c.action) {
        c.action();
      } else if (c.request.has_value()) {
        core_.Add(c.id, *std::move(c.request));
      } else {
        core_.Cancel(c.id, FinishReason::kCancelled, absl::CancelledError("cancelled"));
      }
    }
    if (stopping) {
      // Nothing new runs after Stop(); steps in flight finish first.
      core_.CancelAll(FinishReason::kCancelled,
                      absl::UnavailableError("the server is shutting down"));
      // Imports and page moves would wait for transfers that may never end;
      // their requests end now.
      core_.AbandonTransfers(absl::UnavailableError("the server is shutting down"));
      DeliverRemote();
      PublishLoad();
      DeliverHeldFinishes();
      PublishKvEvents();
      if (!AnyBusy()) return;
      progressed = false;
      continue;
    }
    core_.ExpireDeadlines(absl::Now());
    held_decode_until = absl::InfiniteFuture();
    for (int i = 0; i < kLanes; ++i) {
      LaneState& lane = lanes_[static_cast<size_t>(i)];
      if (lane.thread == nullptr || lane.busy) continue;
      const absl::Time now = absl::Now();
      // A decode step may wait for its turn while a prefill step runs (the
      // prefill lane is dispatched first, so "busy" includes its next step).
      step::StepPlan plan = dispatcher_.Next(static_cast<Lane>(i), now,
                                             lanes_[static_cast<size_t>(Lane::kPrefill)].busy);
      if (static_cast<Lane>(i) == Lane::kDecode) held_decode_until = dispatcher_.NextWake();
      if (plan.sequences.empty()) continue;
      lane.predicted_ms = core_.time_model().PredictMs(StepShape::Of(plan));
      lane.plan = std::move(plan);
      lane.busy = true;
      lane.started = now;
      lane.thread->Run(&lane.plan);
      progressed = true;
    }
    DeliverRemote();
    PublishLoad();
    DeliverHeldFinishes();
    PublishKvEvents();
  }
}

void Scheduler::PublishKvEvents() {
  if (!kv_events_) return;
  std::vector<kvcache::KvEvent> events = core_.TakeKvEvents(/*snapshot=*/false);
  if (events.empty()) return;
  // After a lost batch, the whole index instead (taken only when the index
  // changed: a receiver that keeps refusing costs a snapshot per change, not
  // one per round).
  if (kv_events_resync_) events = core_.TakeKvEvents(/*snapshot=*/true);
  kv_events_resync_ = !kv_events_(std::move(events));
}

void Scheduler::PublishLoad() {
  absl::MutexLock lock(&mu_);
  // Requests only: posted actions (relayed tokens, completions) are not.
  queued_ = core_.waiting();
  for (const auto& entry : inbox_) queued_ += entry.request.has_value() ? 1 : 0;
  queued_tokens_ = core_.waiting_tokens();
  for (const auto& entry : inbox_) {
    if (entry.request.has_value())
      queued_tokens_ += static_cast<int64_t>(entry.request->prompt.size());
  }
  load_.waiting = core_.waiting();
  load_.running = {core_.running(Lane::kPrefill), core_.running(Lane::kDecode)};
  load_.running_remote = core_.remote();
  load_.lease_expirations = core_.lease_expirations();
  load_.preemptions = core_.preemptions();
  load_.handoffs = core_.handoffs();
  load_.kv = core_.kv_stats();
  load_.has_work = core_.HasWork();
  const absl::Time now = absl::Now();
  const double slack = std::min(core_.LeastSlackMs(Lane::kPrefill, now, false, true),
                                core_.LeastSlackMs(Lane::kDecode, now, false, true));
  load_.least_slack_ms = std::isinf(slack) ? std::nullopt : std::optional<double>(slack);
  load_.running_prompt_tokens = core_.running_prompt_tokens();
  const StepTimeModel& model = core_.time_model();
  const int32_t chunk = core_.max_batched_tokens();
  load_.prompt_tokens_per_ms = chunk / model.PredictMs(MixedShape(0, 0, chunk));
  load_.step_time = model.coefficients();
  load_.step_time_error = model.recent_error();
  path_load_ = core_.PathLoadNow();
}

void Scheduler::DeliverHeldFinishes() {
  std::vector<std::pair<std::shared_ptr<RequestSink>, FinishInfo>> finishes;
  finishes.swap(held_finishes_);
  for (auto& [sink, info] : finishes) sink->OnFinish(info);
}

}  // namespace tandem::scheduler
