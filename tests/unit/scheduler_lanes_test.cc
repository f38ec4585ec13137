// SchedulerCore with a prefill and a decode lane, driven by a discrete-event
// simulation: each lane's step takes time by a cost model, the lane that
// finishes first is updated, idle lanes are scheduled again. Invariants are
// checked at every step; the fake worker keeps tokens in the scheduler's
// block ids, so any bookkeeping error changes the generated tokens.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>

#include "scheduler/scheduler_core.h"
#include "tests/unit/fake_worker.h"

namespace tandem::scheduler {
namespace {

constexpr int32_t kBlockSize = 4;

// Stores each step's tokens in the KV slots of its block table and samples a
// hash of everything readable through the table (see scheduler_core_test).
using testing::Record;

// The scheduler's fake worker, with this file's block size.
class FakeWorker : public testing::FakeWorker {
 public:
  explicit FakeWorker(int32_t blocks) : testing::FakeWorker(blocks, kBlockSize) {}
};

using testing::MakeRequest;

// The simulation. Step cost: 1 ms + 0.1 ms per token (a prompt chunk is
// expensive, a decode step cheap).
class Simulation {
 public:
  Simulation(SchedulerOptions options, int32_t blocks) : worker_(blocks) {
    options.kv_blocks = blocks;
    options.block_size = kBlockSize;
    options.clock = [this] { return absl::FromUnixMicros(static_cast<int64_t>(now_ * 1000)); };
    core_ = std::make_unique<SchedulerCore>(options);
    budget_ = options.max_batched_tokens;
    disaggregating_ = options.decode_lane && options.disaggregation.output_threshold.has_value();
  }

  SchedulerCore& core() { return *core_; }
  double now() const { return now_; }
  std::vector<std::vector<int64_t>>& lane_steps() { return lane_steps_; }

  // Schedules idle lanes; returns false when nothing is in flight.
  bool ScheduleIdleLanes() {
    for (int l = 0; l < kLanes; ++l) {
      if (in_flight_[static_cast<size_t>(l)].has_value()) continue;
      const Lane lane = static_cast<Lane>(l);
      step::StepPlan plan = core_->Schedule(lane);
      if (plan.sequences.empty()) continue;
      CheckPlan(lane, plan);
      const double cost = 1.0 + 0.1 * static_cast<double>(plan.TokenCount());
      lane_steps_[static_cast<size_t>(l)].push_back(plan.TokenCount());
      in_flight_[static_cast<size_t>(l)] = {std::move(plan), now_ + cost};
    }
    return in_flight_[0].has_value() || in_flight_[1].has_value();
  }

  // Completes the step that finishes first.
  void CompleteNext() {
    size_t lane = in_flight_[0].has_value() ? 0 : 1;
    if (in_flight_[0].has_value() && in_flight_[1].has_value() &&
        in_flight_[1]->finish < in_flight_[0]->finish) {
      lane = 1;
    }
    PendingStep step = *std::move(in_flight_[lane]);
    in_flight_[lane].reset();
    now_ = step.finish;
    core_->Update(static_cast<Lane>(lane), step.plan, worker_.Execute(step.plan));
  }

  void RunToCompletion(int max_steps = 20000) {
    for (int i = 0; i < max_steps && (core_->HasWork() || in_flight_[0] || in_flight_[1]); ++i) {
      if (!ScheduleIdleLanes()) {
        ADD_FAILURE() << "work is left but no lane can run it";
        return;
      }
      CompleteNext();
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_FALSE(core_->HasWork());
    EXPECT_EQ(core_->free_blocks(), core_->total_blocks()) << "KV blocks leaked";
  }

  bool InFlight(uint64_t id) const {
    for (const auto& f : in_flight_) {
      if (!f.has_value()) continue;
      for (const auto& s : f->plan.sequences) {
        if (s.sequence_id == id) return true;
      }
    }
    return false;
  }

 private:
  struct PendingStep {
    step::StepPlan plan;
    double finish;
  };

  void CheckPlan(Lane lane, const step::StepPlan& plan) {
    EXPECT_LE(plan.TokenCount(), budget_) << "the token budget was exceeded";
    for (const step::SequenceStep& s : plan.sequences) {
      EXPECT_FALSE(InFlight(s.sequence_id)) << "sequence " << s.sequence_id << " in two steps";
      if (lane == Lane::kDecode && disaggregating_) {
        EXPECT_EQ(s.tokens.size(), 1u) << "prompt work on the decode worker";
      }
    }
  }

  FakeWorker worker_;
  std::unique_ptr<SchedulerCore> core_;
  int64_t budget_ = 0;
  bool disaggregating_ = false;
  double now_ = 0.0;
  std::array<std::optional<PendingStep>, kLanes> in_flight_;
  std::vector<std::vector<int64_t>> lane_steps_ = {{}, {}};
};

SchedulerOptions Options(std::optional<int32_t> threshold, bool decode_lane = true) {
  SchedulerOptions o;
  o.max_batched_tokens = 16;
  o.context_length = 512;
  o.decode_lane = decode_lane;
  o.disaggregation.output_threshold = threshold;
  return o;
}

// The tokens a request generates alone on one colocated lane.
std::vector<TokenId> Alone(int32_t prompt, int32_t max_tokens, uint64_t seed) {
  Simulation sim(Options(std::nullopt, false), 256);
  auto sink = std::make_shared<Record>();
  sim.core().Add(1, MakeRequest(prompt, max_tokens, sink, seed));
  sim.RunToCompletion();
  return sink->tokens;
}

TEST(SchedulerLanesTest, LongOutputsMoveAtTheThresholdShortOnesNever) {
  Simulation sim(Options(20), 128);
  auto short_max = std::make_shared<Record>(), long_out = std::make_shared<Record>();
  sim.core().Add(1, MakeRequest(10, 15, short_max, 1));  // max_tokens below the threshold
  sim.core().Add(2, MakeRequest(10, 60, long_out, 2));
  sim.RunToCompletion();
  EXPECT_EQ(short_max->finish->path, Path::kColocated);
  EXPECT_EQ(short_max->finish->path_reason, PathReason::kBelowThreshold);
  EXPECT_EQ(long_out->finish->path, Path::kDisaggregated);
  EXPECT_EQ(long_out->finish->path_reason, PathReason::kThresholdReached);
  EXPECT_EQ(short_max->tokens, Alone(10, 15, 1));
  EXPECT_EQ(long_out->tokens, Alone(10, 60, 2));
  EXPECT_EQ(sim.core().handoffs(), 1);
  // The handoff stamps: after the 20th token, then its first decode step.
  const Timeline& t = long_out->finish->timeline;
  EXPECT_GT(t.handoff_start, t.first_token);
  EXPECT_GE(t.handoff_end, t.handoff_start);
  EXPECT_GT(t.finished, t.handoff_end);
  // 40 decode steps of one token ran on the decode lane.
  EXPECT_EQ(sim.lane_steps()[1].size(), 40u);
}

TEST(SchedulerLanesTest, KnownLongRequestsMoveRightAfterPrefillWithTheirReason) {
  SchedulerOptions options = Options(30);
  options.disaggregation.use_max_tokens = false;
  Simulation sim(options, 128);
  auto hinted = std::make_shared<Record>(), plain = std::make_shared<Record>();
  Request r = MakeRequest(8, 40, hinted, 3);
  r.expected_output_tokens = 35;
  sim.core().Add(1, std::move(r));
  sim.core().Add(2, MakeRequest(8, 40, plain, 4));
  sim.RunToCompletion();
  EXPECT_EQ(hinted->finish->path_reason, PathReason::kExpectedOutputHint);
  // Handed off when its first token came, before the plain one reached 30.
  EXPECT_EQ(hinted->finish->timeline.handoff_start, hinted->finish->timeline.first_token);
  EXPECT_EQ(plain->finish->path_reason, PathReason::kThresholdReached);
  EXPECT_EQ(hinted->tokens, Alone(8, 40, 3));
  EXPECT_EQ(plain->tokens, Alone(8, 40, 4));
}

TEST(SchedulerLanesTest, AWorkloadLearnsItsOutputLengthThenMovesEarly) {
  Simulation sim(Options(12), 128);
  for (uint64_t i = 1; i <= 8; ++i) {  // teach "agent" that it writes 30 tokens
    Request r = MakeRequest(6, 30, std::make_shared<Record>(), i);
    r.workload = "agent";
    sim.core().Add(i, std::move(r));
  }
  sim.RunToCompletion();
  auto next = std::make_shared<Record>();
  Request r = MakeRequest(6, 30, next, 99);
  r.workload = "agent";
  sim.core().Add(100, std::move(r));
  sim.RunToCompletion();
  EXPECT_EQ(next->finish->path_reason, PathReason::kWorkloadEstimate);
  EXPECT_EQ(next->finish->timeline.handoff_start, next->finish->timeline.first_token);
}

TEST(SchedulerLanesTest, MaxTokensAsTheSignalWhenTheOperatorOptsIn) {
  SchedulerOptions options = Options(12);
  options.disaggregation.use_max_tokens = true;
  Simulation sim(options, 64);
  auto r = std::make_shared<Record>();
  sim.core().Add(1, MakeRequest(5, 12, r, 5));
  sim.RunToCompletion();
  EXPECT_EQ(r->finish->path_reason, PathReason::kMaxTokens);
  EXPECT_EQ(r->finish->path, Path::kDisaggregated);
}

TEST(SchedulerLanesTest, ThresholdZeroDisaggregatesEverythingAndOffNothing) {
  for (std::optional<int32_t> threshold : {std::optional<int32_t>(0), std::optional<int32_t>()}) {
    Simulation sim(Options(threshold), 128);
    std::vector<std::shared_ptr<Record>> sinks;
    for (uint64_t i = 1; i <= 6; ++i) {
      sinks.push_back(std::make_shared<Record>());
      sim.core().Add(i, MakeRequest(5 + static_cast<int32_t>(i), 10, sinks.back(), i));
    }
    sim.RunToCompletion();
    for (uint64_t i = 1; i <= 6; ++i) {
      const FinishInfo& f = *sinks[i - 1]->finish;
      EXPECT_EQ(f.path, threshold ? Path::kDisaggregated : Path::kColocated);
      EXPECT_EQ(f.path_reason,
                threshold ? PathReason::kThresholdReached : PathReason::kDisaggregationOff);
      EXPECT_EQ(sinks[i - 1]->tokens, Alone(5 + static_cast<int32_t>(i), 10, i));
    }
    // Off: the decode worker serves colocated requests too (no idle worker).
    EXPECT_FALSE(sim.lane_steps()[1].empty());
  }
}

TEST(SchedulerLanesTest, DecodeStepsAreNeverHeldUpByALongPrompt) {
  Simulation sim(Options(4), 256);
  auto streaming = std::make_shared<Record>();
  sim.core().Add(1, MakeRequest(4, 80, streaming, 1));
  // Let it reach the decode lane, then send a long prompt.
  while (streaming->tokens.size() < 8) {
    ASSERT_TRUE(sim.ScheduleIdleLanes());
    sim.CompleteNext();
  }
  auto long_prompt = std::make_shared<Record>();
  sim.core().Add(2, MakeRequest(400, 2, long_prompt, 2));
  double last = sim.now();
  double worst_gap = 0;
  size_t seen = streaming->tokens.size();
  while (sim.core().HasWork()) {
    ASSERT_TRUE(sim.ScheduleIdleLanes());
    sim.CompleteNext();
    if (streaming->tokens.size() > seen) {
      worst_gap = std::max(worst_gap, sim.now() - last);
      last = sim.now();
      seen = streaming->tokens.size();
    }
  }
  // A decode step costs 1.1 ms; prompt chunks (2.6 ms) run on the other lane.
  EXPECT_LE(worst_gap, 1.1 + 1e-9);
  EXPECT_EQ(streaming->tokens, Alone(4, 80, 1));
  EXPECT_EQ(long_prompt->tokens, Alone(400, 2, 2));
}

TEST(SchedulerLanesTest, PriorityOrdersAdmissionAndAgingPreventsStarvation) {
  SchedulerOptions options = Options(std::nullopt, false);
  options.max_running = 1;
  options.priority_aging = absl::Milliseconds(50);
  Simulation sim(options, 128);
  auto low = std::make_shared<Record>();
  Request r = MakeRequest(4, 5, low, 1);
  r.priority = -3;
  sim.core().Add(1, std::move(r));
  std::vector<std::shared_ptr<Record>> high;
  uint64_t id = 2;
  // A steady stream of priority-0 requests, one new each time one finishes.
  while (!low->finish.has_value()) {
    if (sim.core().waiting() < 2) {
      high.push_back(std::make_shared<Record>());
      sim.core().Add(id, MakeRequest(4, 5, high.back(), id));
      ++id;
    }
    ASSERT_TRUE(sim.ScheduleIdleLanes());
    sim.CompleteNext();
    ASSERT_LT(id, 500u) << "the low-priority request starved";
  }
  // Higher priority first: the low one waited for several, then aged past them.
  EXPECT_GT(high.size(), 3u);
  EXPECT_GT(low->finish->timeline.scheduled - low->finish->timeline.arrival,
            absl::Milliseconds(150));
  sim.RunToCompletion();
}

TEST(SchedulerLanesTest, CancellationInEveryStateFreesEverythingExactlyOnce) {
  Simulation sim(Options(3), 128);
  std::map<std::string, std::shared_ptr<Record>> sinks;
  auto add = [&](const std::string& name, uint64_t id, int32_t prompt) {
    sinks[name] = std::make_shared<Record>();
    Request r = MakeRequest(prompt, 200, sinks[name], id);
    if (name == "on_decode") r.deadline = absl::FromUnixSeconds(1);
    sim.core().Add(id, std::move(r));
  };
  add("waiting", 1, 4);
  sim.core().Cancel(1, FinishReason::kCancelled, absl::CancelledError("client left"));
  EXPECT_EQ(sinks["waiting"]->finishes, 1);
  EXPECT_EQ(sinks["waiting"]->finish->stage, Stage::kQueued);

  add("in_flight_prefill", 2, 40);
  add("mid_handoff", 3, 4);
  add("on_decode", 4, 4);
  ASSERT_TRUE(sim.ScheduleIdleLanes());  // 2's first chunk fills the budget
  ASSERT_TRUE(sim.InFlight(2));
  sim.core().Cancel(2, FinishReason::kCancelled, absl::CancelledError("client left"));
  EXPECT_EQ(sinks["in_flight_prefill"]->finishes, 0) << "must wait for its step";
  // Run until 3 is handed over but not yet picked up by the decode lane, and
  // 4 runs on the decode lane.
  for (int i = 0; i < 200 && !(sinks["mid_handoff"]->tokens.size() >= 3); ++i) {
    sim.CompleteNext();
    if (sinks["mid_handoff"]->tokens.size() >= 3) break;
    sim.ScheduleIdleLanes();
  }
  EXPECT_EQ(sinks["in_flight_prefill"]->finishes, 1);
  EXPECT_EQ(sinks["in_flight_prefill"]->finish->reason, FinishReason::kCancelled);
  EXPECT_EQ(sinks["in_flight_prefill"]->finish->stage, Stage::kPrefill);
  EXPECT_FALSE(sim.InFlight(3));
  sim.core().Cancel(3, FinishReason::kCancelled, absl::CancelledError("client left"));
  EXPECT_EQ(sinks["mid_handoff"]->finishes, 1);
  EXPECT_EQ(sinks["mid_handoff"]->finish->stage, Stage::kHandoff);
  // 4 on the decode lane, in flight or not: a deadline this time.
  for (int i = 0; i < 50; ++i) {
    sim.ScheduleIdleLanes();
    sim.CompleteNext();
  }
  ASSERT_LT(sim.now(), 1000.0);  // milliseconds: the deadline has not passed yet
  EXPECT_EQ(sinks["on_decode"]->finishes, 0);
  sim.core().ExpireDeadlines(absl::FromUnixSeconds(2));
  sim.RunToCompletion();
  EXPECT_EQ(sinks["on_decode"]->finishes, 1);
  EXPECT_EQ(sinks["on_decode"]->finish->path, Path::kDisaggregated);
  EXPECT_EQ(sinks["on_decode"]->finish->stage, Stage::kDecode);
  for (auto& [name, sink] : sinks) EXPECT_EQ(sink->finishes, 1) << name;
  EXPECT_EQ(sim.core().free_blocks(), sim.core().total_blocks());
}

TEST(SchedulerLanesTest, PreemptionAcrossLanesIsInvisibleInTheOutput) {
  Simulation sim(Options(6), 20);  // 80 token slots for 6 requests of 10 + 30
  std::vector<std::shared_ptr<Record>> sinks;
  for (uint64_t i = 1; i <= 6; ++i) {
    sinks.push_back(std::make_shared<Record>());
    sim.core().Add(i, MakeRequest(10, 30, sinks.back(), i));
  }
  sim.RunToCompletion();
  EXPECT_GT(sim.core().preemptions(), 0);
  for (uint64_t i = 1; i <= 6; ++i) {
    EXPECT_EQ(sinks[i - 1]->tokens, Alone(10, 30, i)) << "request " << i;
    EXPECT_EQ(sinks[i - 1]->finishes, 1);
  }
}

}  // namespace
}  // namespace tandem::scheduler
