// The step-time model (scheduler/step_time_model.h): fitted on synthetic
// step times with known coefficients it recovers them; when the machine's
// speed changes it tracks the new times within a bounded number of steps;
// a start-up calibration predicts the two steps it was measured on.
#include "scheduler/step_time_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "scheduler/slo_path.h"

namespace tandem::scheduler {
namespace {

// A step of a random shape: a decode batch, a prompt chunk, or both.
StepShape RandomShape(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> kind(0, 2), rows(1, 32), chunk(16, 512), context(16, 2000);
  StepShape shape;
  const int k = kind(rng);
  if (k != 1) {
    const int n = rows(rng);
    for (int i = 0; i < n; ++i) shape.AddRows(context(rng), 1);
  }
  if (k != 0) {
    // One draw per statement: argument evaluation order differs by compiler.
    const int position = context(rng) / 2;
    shape.AddRows(position, chunk(rng));
  }
  return shape;
}

double TrueMs(const StepShape& s, const StepTimeCoefficients& c) {
  return c.fixed + c.per_token * static_cast<double>(s.tokens) +
         c.per_kilo_read * (s.reads - s.shared_reads) / 1000 +
         c.per_kilo_shared_read * s.shared_reads / 1000;
}

TEST(StepTimeModelTest, RecoversKnownCoefficients) {
  const StepTimeCoefficients truth{4.0, 0.3, 0.02, 0.05};
  StepTimeModel model;  // starts from the defaults: 5 ms + 0.5 ms/token
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> noise(-0.02, 0.02);
  for (int i = 0; i < 400; ++i) {
    const StepShape shape = RandomShape(rng);
    model.Observe(shape, TrueMs(shape, truth) * (1.0 + noise(rng)));
  }
  // The fit forgets (its memory is a few dozen steps), so with 2% noise the
  // smallest term, attention's, is the least sure; the predictions are what
  // the scheduler uses, and they are within the noise.
  const StepTimeCoefficients fit = model.coefficients();
  EXPECT_NEAR(fit.fixed, truth.fixed, 0.1 * truth.fixed);
  EXPECT_NEAR(fit.per_token, truth.per_token, 0.05 * truth.per_token);
  EXPECT_NEAR(fit.per_kilo_read, truth.per_kilo_read, 0.3 * truth.per_kilo_read);
  EXPECT_NEAR(fit.per_kilo_shared_read, truth.per_kilo_shared_read,
              0.3 * truth.per_kilo_shared_read);
  EXPECT_LT(model.recent_error(), 0.03);
  for (int i = 0; i < 50; ++i) {
    const StepShape shape = RandomShape(rng);
    EXPECT_NEAR(model.PredictMs(shape), TrueMs(shape, truth), 0.03 * TrueMs(shape, truth));
  }
  EXPECT_EQ(model.observed_steps(), 400);
}

TEST(StepTimeModelTest, TracksAChangeInSpeedWithinFiftySteps) {
  const StepTimeCoefficients fast{4.0, 0.3, 0.02, 0.05};
  const StepTimeCoefficients slow{8.0, 0.6, 0.04, 0.1};  // half the speed
  StepTimeModel model;
  std::mt19937_64 rng(11);
  for (int i = 0; i < 300; ++i) {
    const StepShape shape = RandomShape(rng);
    model.Observe(shape, TrueMs(shape, fast));
  }
  for (int i = 0; i < 50; ++i) {
    const StepShape shape = RandomShape(rng);
    model.Observe(shape, TrueMs(shape, slow));
  }
  // Within 5% of the new times on fresh shapes.
  for (int i = 0; i < 20; ++i) {
    const StepShape shape = RandomShape(rng);
    EXPECT_NEAR(model.PredictMs(shape), TrueMs(shape, slow), 0.05 * TrueMs(shape, slow));
  }
}

// A decode lane without speculation never sees a shared read: that
// direction of the fit gets no evidence, and bounding it must not stop the
// others from forgetting. After 600 such steps a 10% slowdown (under the
// 15% that resets the fit) is still followed.
TEST(StepTimeModelTest, ADirectionWithoutEvidenceDoesNotStopTheOthersFromForgetting) {
  const StepTimeCoefficients fast{4.0, 0.3, 0.02, 0.05};
  const StepTimeCoefficients slow{4.4, 0.33, 0.022, 0.055};
  StepTimeModel model;
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> rows(1, 16), context(16, 2000);
  auto decodes = [&] {
    StepShape shape;
    const int n = rows(rng);
    for (int i = 0; i < n; ++i) shape.AddRows(context(rng), 1);
    return shape;
  };
  for (int i = 0; i < 600; ++i) {
    const StepShape shape = decodes();
    model.Observe(shape, TrueMs(shape, fast));
  }
  for (int i = 0; i < 150; ++i) {
    const StepShape shape = decodes();
    model.Observe(shape, TrueMs(shape, slow));
  }
  for (int i = 0; i < 20; ++i) {
    const StepShape shape = decodes();
    EXPECT_NEAR(model.PredictMs(shape), TrueMs(shape, slow), 0.02 * TrueMs(shape, slow));
  }
}

// A steady load whose steps all look alike: 24 streams decoding, every
// other step with a 16-token chunk of a prompt, on a machine where reading
// the KV cache costs nothing (the scheduler's simulation; a small model
// with short contexts comes close). The times come a microsecond short,
// as the simulation's truncation to whole microseconds gives them. The read
// coefficients' truth is zero, and the rounding leans the fit a hair below
// it: a fit that clamped its own
// coefficients there fed the clamp back into every residual after it and
// ran away (past 100% error within 200 steps, then without bound).
TEST(StepTimeModelTest, AFitWhoseReadCostsAreZeroStaysOnTheTimes) {
  const StepTimeCoefficients truth{1.0, 0.1, 0.0, 0.0};
  StepTimeModel model;
  model.Calibrate(/*decode_ms=*/1.1, /*chunk_ms=*/7.4, /*chunk_tokens=*/64);
  double worst = 0;
  for (int i = 0; i < 600; ++i) {
    StepShape shape;
    for (int s = 0; s < 24; ++s) shape.AddRows(4 + i / 2 + s, 1);
    if (i % 2 == 0) shape.AddRows(16 * ((i / 2) % 3), 16);
    const double ms = std::floor(TrueMs(shape, truth) * 1000 - 0.5) / 1000;  // 1 us short
    worst = std::max(worst, std::abs(model.PredictMs(shape) - ms) / ms);
    model.Observe(shape, ms);
  }
  EXPECT_LT(worst, 0.01);
  EXPECT_LT(model.recent_error(), 0.01);
}

TEST(StepTimeModelTest, CalibrationPredictsTheStepsItMeasured) {
  StepTimeModel model;
  model.Calibrate(/*decode_ms=*/6.0, /*chunk_ms=*/300.0, /*chunk_tokens=*/512);
  StepShape decode;
  decode.AddRows(0, 1);
  StepShape chunk;
  chunk.AddRows(0, 512);
  EXPECT_NEAR(model.PredictMs(decode), 6.0, 0.3);
  EXPECT_NEAR(model.PredictMs(chunk), 300.0, 6.0);
  EXPECT_EQ(model.observed_steps(), 0);  // calibration is not counted as served steps
}

TEST(StepTimeModelTest, ShapesCountRowsAndPositionsRead) {
  StepShape s;
  s.AddRows(10, 3);  // rows at positions 10, 11, 12 read 11 + 12 + 13
  EXPECT_EQ(s.tokens, 3);
  EXPECT_DOUBLE_EQ(s.reads, 36.0);
  EXPECT_DOUBLE_EQ(s.shared_reads, 12.0 + 13.0)
      << "the first row streams the KV; the others share it";
  s.AddFollowingRows(13, 2);  // two drafts after them: 14 + 15, all shared
  EXPECT_EQ(s.tokens, 5);
  EXPECT_DOUBLE_EQ(s.reads, 36.0 + 29.0);
  EXPECT_DOUBLE_EQ(s.shared_reads, 25.0 + 29.0);
  step::StepPlan plan;
  plan.sequences.resize(2);
  plan.sequences[0].tokens = {1};
  plan.sequences[0].first_position = 99;
  plan.sequences[0].draft_limit = 2;  // verified rows count as planned
  plan.sequences[1].tokens = {1, 2, 3, 4};
  const StepShape p = StepShape::Of(plan);
  EXPECT_EQ(p.tokens, 7);
  EXPECT_DOUBLE_EQ(p.reads, 100 + 101 + 102 + (1 + 2 + 3 + 4));
  EXPECT_DOUBLE_EQ(p.shared_reads, 101 + 102 + (2 + 3 + 4));
}

// The row curve: scaled to R(1) = 1 and R(widest) = widest, so a model whose
// per_token is the slope from 1 to the widest row count predicts every
// measured width; interpolated between widths, never decreasing, the
// identity past the widest and when the measurement cannot make one.
TEST(RowCurveTest, ScalesInterpolatesAndFallsBackToTheIdentity) {
  const RowCurve curve({{4, 8.5}, {1, 6.0}, {2, 6.5}, {3, 6.0}, {8, 16.0}, {5, 15.0}});
  EXPECT_EQ(curve.widest(), 8);
  const double per_row = (16.0 - 6.0) / 7.0;
  EXPECT_DOUBLE_EQ(curve(1), 1.0);
  EXPECT_DOUBLE_EQ(curve(2), 1.0 + 0.5 / per_row);
  EXPECT_DOUBLE_EQ(curve(3), curve(2)) << "a faster wider step does not lower the curve";
  EXPECT_DOUBLE_EQ(curve(4), 1.0 + 2.5 / per_row);
  EXPECT_DOUBLE_EQ(curve(5), 1.0 + 9.0 / per_row);
  EXPECT_DOUBLE_EQ(curve(6), curve(5) + (8.0 - curve(5)) / 3.0);
  EXPECT_DOUBLE_EQ(curve(8), 8.0);
  EXPECT_DOUBLE_EQ(curve(9), 9.0);
  EXPECT_DOUBLE_EQ(curve(512), 512.0);
  StepTimeModel model({6.0 - per_row, per_row, 0, 0});
  model.SetRowCurve(curve);
  for (auto [rows, ms] :
       std::vector<std::pair<int, double>>{{1, 6.0}, {2, 6.5}, {4, 8.5}, {5, 15.0}, {8, 16.0}}) {
    StepShape shape;
    shape.AddRows(0, rows);
    EXPECT_NEAR(model.PredictMs(shape), ms, 1e-9) << rows << " rows";
  }
  model.Reset({1, 1, 0, 0});
  EXPECT_EQ(model.row_curve().widest(), 8) << "a reset keeps the backend's curve";
  for (const RowCurve& identity : {RowCurve(), RowCurve({{1, 6.0}}), RowCurve({{2, 6.0}, {4, 8.0}}),
                                   RowCurve({{1, 6.0}, {8, 5.0}})}) {
    EXPECT_EQ(identity.widest(), 0);
    EXPECT_DOUBLE_EQ(identity(1), 1.0);
    EXPECT_DOUBLE_EQ(identity(5), 5.0);
  }
}

// The path rule (scheduler/slo_path.h) on a known model.
TEST(SloPathTest, TightTpotMovesLooseStaysAndABusyMachineKeepsItsCompute) {
  const StepTimeModel model(StepTimeCoefficients{5.0, 0.6, 0.0});
  PathLoad load;
  load.colocated_decodes = 2;
  load.prompt_backlog = 1500;
  load.mean_context = 300;
  // Colocated, its tokens ride in mixed steps of 3 decodes and a 16-token
  // chunk (5 + 0.6 * 19 = 16.4 ms) while the 1,500 prompt tokens last (94
  // steps), then in decode steps (6.8 ms): 11.3 ms a token over 200 tokens,
  // past the paced 10.8 ms of a 12 ms budget. A decode-lane step of its own
  // takes 5.6 ms, about half the compute at that pace (the colocated
  // streams bring no budget of their own here: nothing to keep for them).
  const LatencyBudget tight{absl::Seconds(5), absl::Milliseconds(12)};
  const PathChoice moved = ChoosePath(model, load, tight, 0, 300, 200);
  EXPECT_NEAR(moved.colocated.tpot_ms, (94 * 16.4 + 106 * 6.8) / 200, 0.01);
  EXPECT_NEAR(moved.disaggregated.tpot_ms, 5.6 * (1 + 1.0 / 200), 0.01);
  EXPECT_NEAR(moved.disaggregated.load, 5.6 / 10.8, 0.01);
  EXPECT_TRUE(moved.disaggregate);
  // A loose budget: colocated steps keep it; no move.
  EXPECT_FALSE(ChoosePath(model, load, {absl::Seconds(5), absl::Milliseconds(300)}, 0, 300, 200)
                   .disaggregate);
  // The two colocated streams at the same tight budget: their own steps
  // (5 + 0.6 * 2 = 6.2 ms) take 0.57 of the compute at the paced 10.8 ms,
  // and a decode-lane step beside them (5.6 ms) would take the machine past
  // its capacity (a second pass over the weights a token): it stays.
  PathLoad tight_others = load;
  tight_others.colocated_tpot_ms = 12;
  const PathChoice stays = ChoosePath(model, tight_others, tight, 0, 300, 200);
  EXPECT_NEAR(stays.disaggregated.load, (5.6 + 6.2) / 10.8, 0.01);
  EXPECT_FALSE(stays.disaggregate);
  // Theirs loose (300 ms): their steps take little of the compute, it moves.
  tight_others.colocated_tpot_ms = 300;
  const PathChoice moves = ChoosePath(model, tight_others, tight, 0, 300, 200);
  EXPECT_NEAR(moves.disaggregated.load, 5.6 / 10.8 + 6.2 / 270, 0.01);
  EXPECT_TRUE(moves.disaggregate);
  // On a remote decode daemon the decode lane's steps take none of this
  // machine's compute, whatever the colocated streams' budget.
  tight_others.colocated_tpot_ms = 12;
  tight_others.shared_compute = false;
  EXPECT_TRUE(ChoosePath(model, tight_others, tight, 0, 300, 200).disaggregate);
  // Prompts arriving at 0.4 of the machine's prompt rate: with the decode
  // lane's half the compute would be oversubscribed; it stays.
  PathLoad busy = load;
  busy.prompt_arrivals_per_ms = 0.4 * 512 / (5 + 0.6 * 512);
  const PathChoice kept = ChoosePath(model, busy, tight, 0, 300, 200);
  EXPECT_GT(kept.disaggregated.load, kMaxLoad);
  EXPECT_FALSE(kept.disaggregate);
  // Nothing to prefill, a lone stream: colocated keeps any budget a
  // decode-lane step would.
  EXPECT_FALSE(
      ChoosePath(model, PathLoad{}, {absl::Seconds(1), absl::Milliseconds(20)}, 0, 300, 200)
          .disaggregate);
  // What it banked counts: a stream that made its first 100 tokens in 4 ms
  // each keeps the budget colocated through the same backlog.
  EXPECT_FALSE(
      ChoosePath(model, load, tight, 0, 300, 100, StreamSoFar{100, 99 * 4.0}).disaggregate);
  // The crossover: the least doubling length at which it moves.
  const std::optional<int32_t> at = DisaggregationCrossover(model, load, tight, 300);
  ASSERT_TRUE(at.has_value());
  EXPECT_TRUE(ChoosePath(model, load, tight, 0, 300, *at).disaggregate);
  if (*at > 1) {
    EXPECT_FALSE(ChoosePath(model, load, tight, 0, 300, *at / 2).disaggregate);
  }
  EXPECT_FALSE(
      DisaggregationCrossover(model, load, {absl::Seconds(5), absl::Milliseconds(300)}, 300)
          .has_value());
}

}  // namespace
}  // namespace tandem::scheduler
