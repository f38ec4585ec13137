// The two lanes on one shared compute resource under the fixed pacing of
// --policy=threshold (DecodePacer through StepDispatcher), in the
// discrete-event simulation of tests/unit/shared_compute_simulation.h.
// Checked: decode streams keep their pacing interval while a long prompt is
// prefilled, the prompt is not starved (and is, with pacing off: the
// control), the compute never idles while a lane has work, and every request
// gets exactly its solo tokens. The SLO policy's simulation is in
// slo_policy_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "tests/unit/shared_compute_simulation.h"

namespace tandem::scheduler {
namespace {

using testing::kTaskMs;
using testing::MakeRequest;
using testing::Record;
using testing::SharedComputeSimulation;
using testing::TimedRecord;

DispatchOptions Paced(DecodePacingOptions pacing) { return {DispatchPolicy::kPaced, pacing, true}; }

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
  SharedComputeSimulation sim(o, Paced({}), 512);
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
  SharedComputeSimulation sim(Options(), Paced(pacing), 512);
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
