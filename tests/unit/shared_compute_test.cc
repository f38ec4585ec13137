// The two lanes on one shared compute resource, as the daemon runs them by
// default: a discrete-event simulation of SchedulerCore's lanes, the
// Scheduler's dispatch rule (DecodePacer) and the compute pool's contract (a
// decode step takes the compute from a prefill step within one task; the
// prefill step resumes when it ends). Checked: decode streams keep their
// pacing interval while a long prompt is prefilled, the prompt is not starved
// (and is, with pacing off: the control), the compute never idles while a
// lane has work, and every request gets exactly its solo tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "scheduler/decode_pacer.h"
#include "scheduler/scheduler_core.h"
#include "tests/unit/fake_worker.h"

namespace tandem::scheduler {
namespace {

constexpr int32_t kBlockSize = 4;
constexpr double kTaskMs = 0.2;  // the pool's preemption granularity

using testing::Record;

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

using testing::MakeRequest;

// Step cost in ms of the whole compute: 1 ms + 0.1 ms per token.
double Cost(const step::StepPlan& plan) {
  return 1.0 + 0.1 * static_cast<double>(plan.TokenCount());
}

class SharedComputeSimulation {
 public:
  SharedComputeSimulation(SchedulerOptions options, DecodePacingOptions pacing, int32_t blocks)
      : worker_(blocks, kBlockSize), pacer_(pacing) {
    options.kv_blocks = blocks;
    options.block_size = kBlockSize;
    options.clock = [this] { return Time(now_); };
    core_ = std::make_unique<SchedulerCore>(options);
  }

  SchedulerCore& core() { return *core_; }
  const double* clock() const { return &now_; }
  // Compute time that passed while a lane had work it could not run.
  double idle_with_work() const { return idle_with_work_; }
  // The longest wait of a decode step from dispatch to compute.
  double max_decode_wait() const { return max_decode_wait_; }

  // Adds a request when the simulated clock reaches `at_ms`.
  void AddAt(double at_ms, uint64_t id, Request request) {
    arrivals_.push_back({at_ms, id, std::move(request)});
  }

  void RunToCompletion(int max_events = 200000) {
    for (int i = 0; i < max_events; ++i) {
      Admit();
      Dispatch();
      if (!prefill_ && !decode_ && arrivals_.empty() && !core_->HasWork()) break;
      Advance();
      if (::testing::Test::HasFailure()) return;
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
  };
  struct Arrival {
    double at;
    uint64_t id;
    Request request;
  };

  static absl::Time Time(double ms) {
    return absl::UnixEpoch() + absl::Microseconds(static_cast<int64_t>(ms * 1000));
  }

  void Admit() {
    while (!arrivals_.empty() && arrivals_.front().at <= now_) {
      core_->Add(arrivals_.front().id, std::move(arrivals_.front().request));
      arrivals_.erase(arrivals_.begin());
    }
  }

  // The Scheduler's rule: prefill first, then decode unless paced.
  void Dispatch() {
    if (!prefill_) {
      step::StepPlan plan = core_->Schedule(Lane::kPrefill);
      if (!plan.sequences.empty()) prefill_ = Running{plan, Cost(plan), now_, now_};
    }
    if (!decode_ && pacer_.MayStart(Time(now_), prefill_.has_value())) {
      step::StepPlan plan = core_->Schedule(Lane::kDecode);
      if (!plan.sequences.empty()) {
        for (const step::SequenceStep& s : plan.sequences) {
          EXPECT_EQ(s.tokens.size(), 1u) << "prompt work on the decode lane";
        }
        pacer_.OnStart(Time(now_));
        decode_ = Running{plan, Cost(plan), prefill_ ? now_ + kTaskMs : now_, now_};
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
    if (!decode_ && core_->running(Lane::kDecode) > 0) {
      const double paced = absl::ToDoubleMilliseconds(pacer_.NextStart() - absl::UnixEpoch());
      if (paced > now_) next = std::min(next, paced);
    }
    if (computing == nullptr) {
      // Nothing runs: only an arrival or a paced step may come next, and no
      // lane may have runnable work meanwhile.
      ASSERT_LT(next, 1e300) << "work is left but nothing can run it";
      if (core_->HasWork()) idle_with_work_ += next - now_;
    } else {
      computing->remaining -= next - now_;
    }
    now_ = next;
    if (decode_ && decode_computes && decode_->remaining <= 1e-9) {
      max_decode_wait_ = std::max(max_decode_wait_, decode_->start - decode_->dispatched);
      core_->Update(Lane::kDecode, decode_->plan, worker_.Execute(decode_->plan));
      pacer_.OnEnd(Time(now_));
      decode_.reset();
    } else if (prefill_ && !decode_computes && prefill_->remaining <= 1e-9) {
      core_->Update(Lane::kPrefill, prefill_->plan, worker_.Execute(prefill_->plan));
      prefill_.reset();
    }
  }

  testing::FakeWorker worker_;
  DecodePacer pacer_;
  std::unique_ptr<SchedulerCore> core_;
  double now_ = 0.0;
  double idle_with_work_ = 0.0;
  double max_decode_wait_ = 0.0;
  std::optional<Running> prefill_, decode_;
  std::vector<Arrival> arrivals_;
};

SchedulerOptions Options() {
  SchedulerOptions o;
  o.max_batched_tokens = 16;
  o.context_length = 1024;
  o.decode_lane = true;
  o.disaggregation.output_threshold = 4;
  return o;
}

// The tokens a request generates alone on one colocated lane.
std::vector<TokenId> Alone(int32_t prompt, int32_t max_tokens, uint64_t seed) {
  SchedulerOptions o = Options();
  o.decode_lane = false;
  o.disaggregation.output_threshold.reset();
  SharedComputeSimulation sim(o, {}, 512);
  auto sink = std::make_shared<Record>();
  sim.AddAt(0, 1, MakeRequest(prompt, max_tokens, sink, seed));
  sim.RunToCompletion();
  return sink->tokens;
}

// The gaps between a request's token arrivals (ms), after its first
// `skip` tokens.
std::vector<double> Gaps(const TimedRecord& r, size_t skip) {
  std::vector<double> gaps;
  for (size_t i = skip + 1; i < r.times.size(); ++i) gaps.push_back(r.times[i] - r.times[i - 1]);
  return gaps;
}

struct Outcome {
  std::shared_ptr<TimedRecord> stream_a, stream_b, prompt;
  double prompt_done = 0, streams_done = 0, idle_with_work = 0, max_decode_wait = 0;
};

// Two long-output streams (moved to the decode lane after 4 tokens), a
// 400-token prompt arriving once they decode, then a short chat.
Outcome RunMixedLoad(DecodePacingOptions pacing) {
  SharedComputeSimulation sim(Options(), pacing, 512);
  Outcome o{std::make_shared<TimedRecord>(sim.clock()), std::make_shared<TimedRecord>(sim.clock()),
            std::make_shared<TimedRecord>(sim.clock())};
  sim.AddAt(0, 1, MakeRequest(8, 300, o.stream_a, 1));
  sim.AddAt(0, 2, MakeRequest(8, 300, o.stream_b, 2));
  sim.AddAt(30, 3, MakeRequest(400, 2, o.prompt, 3));
  sim.RunToCompletion();
  o.idle_with_work = sim.idle_with_work();
  o.max_decode_wait = sim.max_decode_wait();
  auto done = [](const Record& r) {
    return absl::ToDoubleMilliseconds(r.finish->timeline.finished - absl::UnixEpoch());
  };
  o.prompt_done = done(*o.prompt);
  o.streams_done = std::max(done(*o.stream_a), done(*o.stream_b));
  return o;
}

TEST(SharedComputeTest, PacedDecodeKeepsItsIntervalAndThePromptIsNotStarved) {
  const DecodePacingOptions pacing{absl::Milliseconds(5), 0.5};
  const Outcome o = RunMixedLoad(pacing);
  ASSERT_TRUE(o.prompt->finish.has_value() && o.stream_a->finish.has_value());
  // Exactly the solo tokens, whatever ran beside them.
  EXPECT_EQ(o.stream_a->tokens, Alone(8, 300, 1));
  EXPECT_EQ(o.stream_b->tokens, Alone(8, 300, 2));
  EXPECT_EQ(o.prompt->tokens, Alone(400, 2, 3));
  EXPECT_EQ(o.stream_a->finish->path, Path::kDisaggregated);
  // The compute never idled while a lane had work.
  EXPECT_EQ(o.idle_with_work, 0.0);
  // A decode step waited at most one task for the compute.
  EXPECT_LE(o.max_decode_wait, kTaskMs + 1e-9);
  // While the prompt was prefilled, the streams' tokens came every paced
  // interval: the gap is at most the interval, plus one task, plus one
  // decode step (1.2 ms for two sequences) rounded to the clock.
  for (const auto* r : {o.stream_a.get(), o.stream_b.get()}) {
    for (double gap : Gaps(*r, 5)) EXPECT_LE(gap, 5.0 + kTaskMs + 1.2 + 0.01);
  }
  // The prompt (25 chunks of 2.6 ms) got at least its share: done long
  // before the streams, within twice its work plus the decode steps.
  EXPECT_LT(o.prompt_done, o.streams_done);
  EXPECT_LT(o.prompt_done - 30, 2 * 25 * 2.6 + 20);
}

TEST(SharedComputeTest, WithoutPacingDecodeStepsStarveThePrompt) {
  // The control: decode first and always. The streams' steps run back to
  // back, so the prompt waits for them to finish.
  const Outcome o = RunMixedLoad({absl::ZeroDuration(), 0.0});
  EXPECT_GT(o.prompt_done, o.streams_done - 5.0);
  EXPECT_EQ(o.idle_with_work, 0.0);
}

TEST(SharedComputeTest, LongDecodeStepsLeaveThePrefillLaneItsShare) {
  // A share of 0.5 with an interval below the decode step: the decode lane
  // may start again only after as much prefill time as its step took.
  const Outcome o = RunMixedLoad({absl::Milliseconds(1), 0.5});
  EXPECT_LT(o.prompt_done, o.streams_done);
  EXPECT_EQ(o.idle_with_work, 0.0);
}

}  // namespace
}  // namespace tandem::scheduler
