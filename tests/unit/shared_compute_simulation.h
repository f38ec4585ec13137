// A discrete-event simulation of the two lanes on one shared compute
// resource, as the daemon runs them by default: SchedulerCore's lanes, the
// Scheduler's dispatch rule (StepDispatcher, the class the Scheduler itself
// calls) and the compute pool's contract (a decode step takes the compute
// from a prefill step within one task; the prefill step resumes when it
// ends). Time is simulated milliseconds; a step costs `cost` of compute.
// Every step that ends is fed to the dispatcher (OnEnd) as the Scheduler
// does, so the SLO policy's step-time model learns the simulated costs.
#ifndef TANDEM_TESTS_UNIT_SHARED_COMPUTE_SIMULATION_H_
#define TANDEM_TESTS_UNIT_SHARED_COMPUTE_SIMULATION_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "scheduler/scheduler_core.h"
#include "scheduler/step_dispatcher.h"
#include "tests/unit/fake_worker.h"

namespace tandem::scheduler::testing {

inline constexpr int32_t kSimBlockSize = 4;
inline constexpr double kTaskMs = 0.2;  // the pool's preemption granularity

// A Record that also notes when (simulated ms) each token came.
struct TimedRecord : Record {
  explicit TimedRecord(const double* clock) : clock(clock) {}
  bool OnToken(TokenId token, bool stop, const step::TokenLogprobs* logprobs) override {
    times.push_back(*clock);
    return Record::OnToken(token, stop, logprobs);
  }
  const double* clock;
  std::vector<double> times;
};

// Step cost in ms of the whole compute: 1 ms + 0.1 ms per token.
inline double DefaultCost(const step::StepPlan& plan) {
  return 1.0 + 0.1 * static_cast<double>(plan.TokenCount());
}

inline absl::Time SimTime(double ms) {
  return absl::UnixEpoch() + absl::Microseconds(static_cast<int64_t>(ms * 1000));
}

class SharedComputeSimulation {
 public:
  using CostFn = std::function<double(const step::StepPlan&)>;

  SharedComputeSimulation(SchedulerOptions options, DispatchOptions dispatch, int32_t blocks,
                          CostFn cost = DefaultCost)
      : worker_(blocks, kSimBlockSize), cost_(std::move(cost)) {
    options.kv_blocks = blocks;
    options.block_size = kSimBlockSize;
    options.clock = [this] { return SimTime(now_); };
    core_ = std::make_unique<SchedulerCore>(options);
    dispatcher_ = std::make_unique<StepDispatcher>(dispatch, core_.get());
  }

  SchedulerCore& core() { return *core_; }
  const double* clock() const { return &now_; }
  // Compute time that passed while a lane had work it could not run.
  double idle_with_work() const { return idle_with_work_; }
  // The longest wait of a decode step from dispatch to compute.
  double max_decode_wait() const { return max_decode_wait_; }

  // Adds a request when the simulated clock reaches `at_ms`.
  void AddAt(double at_ms, uint64_t id, Request request) {
    auto it = std::upper_bound(arrivals_.begin(), arrivals_.end(), at_ms,
                               [](double t, const Arrival& a) { return t < a.at; });
    request.received = SimTime(at_ms);
    arrivals_.insert(it, Arrival{at_ms, id, std::move(request)});
  }

  void RunToCompletion(int max_events = 400000) {
    for (int i = 0; i < max_events; ++i) {
      Admit();
      Dispatch();
      if (!prefill_ && !decode_ && arrivals_.empty() && !core_->HasWork()) break;
      Advance();
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_FALSE(core_->HasWork());
    EXPECT_EQ(core_->free_blocks(), core_->total_blocks()) << "KV blocks leaked";
  }

 private:
  struct Running {
    step::StepPlan plan;
    double remaining;  // ms of compute
    double start;      // when it may compute (a decode step waits one task)
    double dispatched;
    double computed = 0;
  };
  struct Arrival {
    double at;
    uint64_t id;
    Request request;
  };

  void Admit() {
    while (!arrivals_.empty() && arrivals_.front().at <= now_) {
      core_->Add(arrivals_.front().id, std::move(arrivals_.front().request));
      arrivals_.erase(arrivals_.begin());
    }
  }

  // The Scheduler's loop: the prefill lane first, then the decode lane.
  void Dispatch() {
    if (!prefill_) {
      step::StepPlan plan = dispatcher_->Next(Lane::kPrefill, SimTime(now_), false);
      if (!plan.sequences.empty()) prefill_ = Running{plan, cost_(plan), now_, now_};
    }
    wake_ = 1e300;
    if (!decode_) {
      step::StepPlan plan = dispatcher_->Next(Lane::kDecode, SimTime(now_), prefill_.has_value());
      if (dispatcher_->NextWake() != absl::InfiniteFuture()) {
        wake_ = absl::ToDoubleMilliseconds(dispatcher_->NextWake() - absl::UnixEpoch());
      }
      if (!plan.sequences.empty()) {
        for (const step::SequenceStep& s : plan.sequences) {
          EXPECT_EQ(s.tokens.size(), 1u) << "prompt work on the decode lane";
        }
        decode_ = Running{plan, cost_(plan), prefill_ ? now_ + kTaskMs : now_, now_};
      }
    }
  }

  void Advance() {
    const bool decode_computes = decode_ && now_ >= decode_->start;
    Running* computing = decode_computes ? &*decode_ : (prefill_ ? &*prefill_ : nullptr);
    double next = 1e300;
    if (computing != nullptr) next = now_ + computing->remaining;
    if (decode_ && !decode_computes) next = std::min(next, decode_->start);
    if (!arrivals_.empty()) next = std::min(next, arrivals_.front().at);
    if (!decode_ && wake_ > now_) next = std::min(next, wake_);
    if (computing == nullptr) {
      // Nothing runs: only an arrival or a paced step may come next, and no
      // lane may have runnable work meanwhile.
      ASSERT_LT(next, 1e300) << "work is left but nothing can run it";
      if (core_->HasWork()) idle_with_work_ += next - now_;
    } else {
      computing->remaining -= next - now_;
      computing->computed += next - now_;
    }
    now_ = next;
    if (decode_ && decode_computes && decode_->remaining <= 1e-9) {
      max_decode_wait_ = std::max(max_decode_wait_, decode_->start - decode_->dispatched);
      const step::StepResult result = worker_.Execute(decode_->plan);
      dispatcher_->OnEnd(Lane::kDecode, decode_->plan, result, SimTime(now_),
                         absl::Microseconds(static_cast<int64_t>(decode_->computed * 1000)));
      core_->Update(Lane::kDecode, decode_->plan, result);
      decode_.reset();
    } else if (prefill_ && !decode_computes && prefill_->remaining <= 1e-9) {
      const step::StepResult result = worker_.Execute(prefill_->plan);
      dispatcher_->OnEnd(Lane::kPrefill, prefill_->plan, result, SimTime(now_),
                         absl::Microseconds(static_cast<int64_t>(prefill_->computed * 1000)));
      core_->Update(Lane::kPrefill, prefill_->plan, result);
      prefill_.reset();
    }
  }

  FakeWorker worker_;
  CostFn cost_;
  std::unique_ptr<SchedulerCore> core_;
  std::unique_ptr<StepDispatcher> dispatcher_;
  double now_ = 0.0;
  double wake_ = 1e300;
  double idle_with_work_ = 0.0;
  double max_decode_wait_ = 0.0;
  std::optional<Running> prefill_, decode_;
  std::vector<Arrival> arrivals_;
};

}  // namespace tandem::scheduler::testing

#endif  // TANDEM_TESTS_UNIT_SHARED_COMPUTE_SIMULATION_H_
