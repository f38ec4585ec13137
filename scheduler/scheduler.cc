#include "scheduler/scheduler.h"

#include "common/strings.h"

namespace tandem::scheduler {

Scheduler::Scheduler(SchedulerOptions options, int32_t max_queued, step::Worker* worker)
    : max_queued_(max_queued), worker_(worker), core_(std::move(options)) {
  {
    absl::MutexLock lock(&mu_);
    load_.kv = core_.kv_stats();
  }
  thread_ = std::thread([this] { Loop(); });
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
  const uint64_t id = next_id_++;
  ++queued_;
  inbox_.push_back({id, std::move(request)});
  return id;
}

void Scheduler::Cancel(uint64_t sequence_id) {
  absl::MutexLock lock(&mu_);
  inbox_.push_back({sequence_id, std::nullopt});
}

void Scheduler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

SchedulerLoad Scheduler::Load() const {
  absl::MutexLock lock(&mu_);
  return load_;
}

void Scheduler::Loop() {
  for (;;) {
    std::vector<Command> commands;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !inbox_.empty(); };
      if (!core_.HasWork()) {
        mu_.AwaitWithDeadline(absl::Condition(&ready), core_.NextDeadline());
      }
      commands.swap(inbox_);
      stopping = stopping_;
    }
    for (Command& c : commands) {
      if (c.request.has_value()) {
        core_.Add(c.id, *std::move(c.request));
      } else {
        core_.Cancel(c.id, FinishReason::kCancelled, absl::CancelledError("cancelled"));
      }
    }
    if (stopping) {
      // Cancel whatever is left; nothing runs after Stop().
      core_.CancelAll(FinishReason::kCancelled,
                      absl::UnavailableError("the server is shutting down"));
      absl::MutexLock lock(&mu_);
      queued_ = 0;
      return;
    }
    core_.ExpireDeadlines(absl::Now());
    if (core_.HasWork()) {
      step::StepPlan plan = core_.Schedule();
      if (!plan.sequences.empty()) core_.Update(plan, worker_->Execute(plan));
    }
    absl::MutexLock lock(&mu_);
    queued_ = static_cast<int32_t>(inbox_.size()) + core_.waiting();
    load_.waiting = core_.waiting();
    load_.running = core_.running();
    load_.preemptions = core_.preemptions();
    load_.kv = core_.kv_stats();
  }
}

}  // namespace tandem::scheduler
