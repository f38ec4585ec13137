// The draft-length policy: speculation where it pays, none where it does not.
#include "scheduler/speculation_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace tandem::scheduler {
namespace {

SpeculationOptions Ngram() {
  SpeculationOptions o;
  o.proposer = step::Proposer::kNgram;
  o.max_draft = 8;
  return o;
}

// A step-time model with known coefficients (ms) and no fitting.
StepTimeModel Model(double fixed, double per_token, double per_kilo_read = 0.0,
                    double per_kilo_shared_read = 0.0, RowCurve curve = {}) {
  StepTimeModel model({fixed, per_token, per_kilo_read, per_kilo_shared_read});
  model.SetRowCurve(std::move(curve));
  model.Freeze();
  return model;
}

// The drafts for a step of the candidates' decode rows only (each at the
// position before its context's end).
std::vector<int32_t> Allocate(const std::vector<DraftCandidate>& candidates, int32_t budget,
                              const StepTimeModel& model, const SpeculationOptions& o = Ngram()) {
  StepShape step;
  for (const DraftCandidate& c : candidates) step.AddRows(std::max(c.context - 1, 0), 1);
  return AllocateDrafts(candidates, budget, step, model, o);
}

TEST(AcceptanceEstimateTest, FollowsRecentVerifications) {
  AcceptanceEstimate e(0.5);
  EXPECT_DOUBLE_EQ(e.rate(), 0.5);
  for (int i = 0; i < 20; ++i) e.Record(8, 8);
  EXPECT_GT(e.rate(), 0.95);
  for (int i = 0; i < 20; ++i) e.Record(4, 0);
  EXPECT_LT(e.rate(), 0.1);
  const double before = e.rate();
  e.Record(0, 0);  // nothing drafted: no evidence
  EXPECT_DOUBLE_EQ(e.rate(), before);
}

// A sequence that stopped drafting drifts back to the prior, so it tries
// again: a few idle steps are not enough, a few dozen are.
TEST(AcceptanceEstimateTest, IdleStepsBringTheEstimateBackToThePrior) {
  AcceptanceEstimate e(0.5);
  for (int i = 0; i < 20; ++i) e.Record(4, 0);
  const double collapsed = e.rate();
  ASSERT_LT(collapsed, 0.1);
  // Batch 1 with a step of 2.3 + 1 per token drafts one token from a = 1/3.3.
  const StepTimeModel model = Model(2.3, 1);
  const std::vector<DraftCandidate> now = {{collapsed, 100}};
  EXPECT_EQ(Allocate(now, 128, model)[0], 0);
  int idle = 0;
  while (Allocate({{e.rate(), 100}}, 128, model)[0] == 0) {
    e.Idle();
    ++idle;
    ASSERT_LT(idle, 1000) << "never drafts again";
  }
  EXPECT_GE(idle, 10);
  EXPECT_LE(idle, 40);
  for (int i = 0; i < 500; ++i) e.Idle();
  EXPECT_NEAR(e.rate(), 0.5, 1e-6);
}

// At a long context a verified row costs most of a step, so even the
// prior's acceptance never pays for a token: without probes a sequence that
// starts there never drafts, and never learns that its output is a copy.
TEST(AcceptanceEstimateTest, ASequenceThatNeverDraftsIsProbedAndThenDraftsWhatPays) {
  const StepTimeModel model = Model(4.3, 2.3, 3.2, 1.9);
  AcceptanceEstimate e(0.5);
  auto allocate = [&] { return Allocate({{e.rate(), 100, 5000, e.probe_due()}}, 128, model)[0]; };
  int32_t steps = 0;
  while (allocate() == 0) {
    e.Idle();
    ASSERT_LT(++steps, 1000) << "never drafts";
  }
  EXPECT_EQ(steps, AcceptanceEstimate::kProbeAfter);
  EXPECT_EQ(allocate(), 1) << "a probe is one token";
  EXPECT_FALSE(Allocate({{e.rate(), 100, 5000, false}}, 128, model)[0] > 0)
      << "the cost model alone would not draft";
  // The probe is accepted (a copy): drafting pays from now on, and grows.
  e.Record(1, 1);
  EXPECT_FALSE(e.probe_due());
  EXPECT_GE(allocate(), 1);
  for (int i = 0; i < 6; ++i) e.Record(allocate(), allocate());
  EXPECT_GE(allocate(), 4);
  // A probe the proposer had nothing for restarts the probe clock: the next
  // one is kProbeAfter idle steps later, not the very next step.
  AcceptanceEstimate none(0.5);
  for (int i = 0; i < AcceptanceEstimate::kProbeAfter; ++i) none.Idle();
  ASSERT_TRUE(none.probe_due());
  const double before = none.rate();
  none.Record(0, 0);
  EXPECT_FALSE(none.probe_due());
  EXPECT_DOUBLE_EQ(none.rate(), before) << "no evidence";
  for (int i = 0; i < AcceptanceEstimate::kProbeAfter - 1; ++i) none.Idle();
  EXPECT_FALSE(none.probe_due());
  none.Idle();
  EXPECT_TRUE(none.probe_due());
  // A probe never takes what the budget or the sequence's cap do not allow.
  EXPECT_EQ(Allocate({{0.5, 0, 5000, true}}, 128, model)[0], 0);
  EXPECT_EQ(Allocate({{0.5, 100, 5000, true}}, 0, model)[0], 0);
}

TEST(AllocateDraftsTest, DraftsLongWhenAcceptanceIsHighAndVerificationCheap) {
  // Batch 1, a step costs 10 + 1 per token: a 0.9 acceptance pays for a long draft.
  EXPECT_EQ(Allocate({{0.9, 100}}, 128, Model(10, 1))[0], 8);
  // Poor acceptance: a short draft at most.
  EXPECT_LE(Allocate({{0.2, 100}}, 128, Model(10, 1))[0], 1);
  // No fixed cost (purely compute-bound): a drafted token costs as much as
  // a decode, and never yields as much: none.
  EXPECT_EQ(Allocate({{0.9, 100}}, 128, Model(0, 1))[0], 0);
}

TEST(AllocateDraftsTest, SpeculationShrinksAsTheBatchGrows) {
  // Measured shape on the CPU: fixed ~ 2.3 per-token costs.
  int previous = 1 << 30;
  for (int batch : {1, 2, 4, 8, 16}) {
    const std::vector<DraftCandidate> seqs(static_cast<size_t>(batch), {0.8, 100});
    const std::vector<int32_t> k = Allocate(seqs, 1024, Model(2.3, 1));
    int total = 0;
    for (int32_t x : k) total += x;
    EXPECT_LE(total / batch, previous) << "batch " << batch;
    previous = total / batch;
  }
  EXPECT_EQ(previous, 0);  // at 16 sequences the step is compute-bound
}

// At long contexts a sequence's step is dominated by reading its KV, which
// its drafts share: speculation pays at batch sizes where, at short
// contexts, the step is compute-bound and it does not. (Coefficients of the
// shape measured on the CPU: per 1,000 context tokens 6 per-token units for
// the first row, 0.9 for each extra one.)
TEST(AllocateDraftsTest, LongContextsKeepSpeculationWorthwhileAtLargerBatches) {
  const StepTimeModel model = Model(2.3, 1, 6, 0.9);
  auto drafted = [&](int batch, int32_t context) {
    const std::vector<DraftCandidate> seqs(static_cast<size_t>(batch), {0.8, 100, context});
    int total = 0;
    for (int32_t x : Allocate(seqs, 1024, model)) total += x;
    return total;
  };
  EXPECT_EQ(drafted(16, 16), 0);
  EXPECT_GE(drafted(16, 4000), 16);
  EXPECT_GT(drafted(1, 4000), drafted(1, 16));
}

TEST(AllocateDraftsTest, RespectsCapsBudgetAndTheFixedMode) {
  const std::vector<DraftCandidate> seqs = {{0.99, 3}, {0.99, 100}};
  const StepTimeModel cheap = Model(100, 1);
  const std::vector<int32_t> k = Allocate(seqs, 128, cheap);
  EXPECT_EQ(k[0], 3);
  EXPECT_EQ(k[1], 8);
  const std::vector<int32_t> five = Allocate(seqs, 5, cheap);
  EXPECT_EQ(five[0] + five[1], 5);
  SpeculationOptions fixed = Ngram();
  fixed.adaptive = false;
  const std::vector<DraftCandidate> hopeless = {{0.0, 100}, {0.0, 2}};
  EXPECT_EQ(Allocate(hopeless, 128, Model(1, 1), fixed), (std::vector<int32_t>{8, 2}));
  SpeculationOptions off = fixed;
  off.proposer = step::Proposer::kNone;
  EXPECT_EQ(Allocate(hopeless, 128, Model(1, 1), off), (std::vector<int32_t>{0, 0}));
}

TEST(AllocateDraftsTest, ADraftModelsCostShortensItsDrafts) {
  const StepTimeModel model = Model(10, 1);
  SpeculationOptions draft = Ngram();
  draft.proposer = step::Proposer::kDraftModel;
  draft.draft_cost.fixed = 4;  // each drafting round reads part of the weights
  draft.draft_cost.per_token = 0.3;
  const std::vector<DraftCandidate> one = {{0.8, 100}};
  EXPECT_LT(Allocate(one, 128, model, draft)[0], Allocate(one, 128, model)[0]);
}

// A row curve with a jump: products of up to 4 rows cost little more than
// one; from 5 rows the weights are decoded into scratch first (a jump of
// most of a step), and past that each row adds little. (Timings of this
// shape measured on the default model at batch 1 with the CPU kernels of
// 2026-12-04: tandem-bench --verify_widths.) The policy
// drafts within the cheap rows at a moderate acceptance, and crosses the
// jump when acceptance pays for it: one sequence's drafts, or the drafts of
// a batch together.
const std::vector<RowCurve::Timing> kStaircase = {{1, 6.0},  {2, 6.5},   {4, 8.5},  {5, 15.0},
                                                  {8, 16.0}, {16, 22.0}, {32, 42.0}};
constexpr double kStaircasePerToken = (42.0 - 6.0) / 31.0;

// A step-time model through kStaircase's widths.
StepTimeModel Staircase() {
  return Model(6.0 - kStaircasePerToken, kStaircasePerToken, 0, 0, RowCurve(kStaircase));
}

TEST(AllocateDraftsTest, DraftsFollowTheBackendsRowCurve) {
  const std::vector<RowCurve::Timing>& timings = kStaircase;
  const double per_token = kStaircasePerToken;
  const StepTimeModel model = Staircase();
  SpeculationOptions o = Ngram();
  o.max_draft = 32;
  // The model predicts the measured widths.
  for (const RowCurve::Timing& t : timings) {
    StepShape shape;
    shape.AddRows(0, t.rows);
    EXPECT_NEAR(model.PredictMs(shape), t.ms, 1e-9) << t.rows << " rows";
  }
  // 0.8 a token: 1 + 0.8 + 0.64 + 0.51 tokens in 8.5 ms (0.35 a ms); a
  // fourth draft makes the step 15 ms for 0.41 more.
  EXPECT_EQ(Allocate({{0.8, 100}}, 128, model, o)[0], 3);
  // 0.95: the 16-row step (11.2 tokens in 22 ms) beats the 4-row one (3.7
  // in 8.5); the 32-row one (16.1 in 42) does not.
  EXPECT_EQ(Allocate({{0.95, 100}}, 128, model, o)[0], 15);
  // With the same model but no curve (linear from 1 to 32 rows) a 0.8
  // acceptance drafts past the jump it does not see.
  EXPECT_GT(Allocate({{0.8, 100}}, 128, Model(6.0 - per_token, per_token), o)[0], 3);
  // Four sequences fill the cheap rows. At 0.8, 3 drafts each make a 16-row
  // step (4 + 4 x 1.95 = 11.8 tokens in 22 ms: 0.54 a ms, against 4 in 8.5
  // ms: 0.47), which no one sequence's drafts pay for alone (at best 0.40).
  const std::vector<DraftCandidate> four(4, {0.8, 100});
  EXPECT_EQ(Allocate(four, 128, model, o), (std::vector<int32_t>{3, 3, 3, 3}));
  // At 0.5 no total pays: 4 drafts (8 rows) give 6 tokens in 16 ms.
  const std::vector<DraftCandidate> poor(4, {0.5, 100});
  EXPECT_EQ(Allocate(poor, 128, model, o), (std::vector<int32_t>{0, 0, 0, 0}));
}

TEST(CopyAcceptanceTest, LongCopiesGoOnAndFreshMatchesEndPerSource) {
  CopyAcceptance table;
  // Nothing known: the sequence's own rate.
  EXPECT_DOUBLE_EQ(table.Continues(step::DraftSource::kRequest, 40, 0.6), 0.6);
  for (int i = 0; i < 20; ++i) {
    table.Record(step::DraftSource::kRequest, 32, 16, 16);  // a long copy, all accepted
    table.Record(step::DraftSource::kRequest, 1, 4, 0);     // a one-token match, wrong at once
  }
  EXPECT_GT(table.Continues(step::DraftSource::kRequest, 40, 0.5), 0.9);
  EXPECT_LT(table.Continues(step::DraftSource::kRequest, 1, 0.5), 0.1);
  // The other source learned nothing.
  EXPECT_DOUBLE_EQ(table.Continues(step::DraftSource::kGlobal, 40, 0.5), 0.5);
  // Agreement lengths outside the evidence: the prior.
  EXPECT_DOUBLE_EQ(table.Continues(step::DraftSource::kRequest, 5, 0.5), 0.5);
  // Old evidence fades: a run of rejections at 40 turns the estimate.
  for (int i = 0; i < 200; ++i) table.Record(step::DraftSource::kRequest, 40, 1, 0);
  EXPECT_LT(table.Continues(step::DraftSource::kRequest, 40, 0.5), 0.1);
}

TEST(CopyAcceptanceTest, TokensAfterTheFirstRejectionAndNonCopiesTeachNothing) {
  CopyAcceptance table;
  // Drafted at agreement 2 and rejected there: the tokens drafted at 3-7
  // were never judged.
  table.Record(step::DraftSource::kRequest, 2, 6, 0);
  EXPECT_LT(table.Continues(step::DraftSource::kRequest, 2, 0.5), 0.5);
  EXPECT_DOUBLE_EQ(table.Continues(step::DraftSource::kRequest, 5, 0.5), 0.5);
  // A proposer that does not copy (match 0), or a draft model, records nothing.
  table.Record(step::DraftSource::kRequest, 0, 8, 8);
  table.Record(step::DraftSource::kModel, 8, 8, 8);
  EXPECT_DOUBLE_EQ(table.Continues(step::DraftSource::kRequest, 8, 0.5), 0.5);
  // Buckets double: 1 | 2-3 | 4-7 | ... | 128-255 | 256 and more.
  EXPECT_EQ(CopyAcceptance::Bucket(1), 0);
  EXPECT_EQ(CopyAcceptance::Bucket(3), 1);
  EXPECT_EQ(CopyAcceptance::Bucket(4), 2);
  EXPECT_EQ(CopyAcceptance::Bucket(255), 7);
  EXPECT_EQ(CopyAcceptance::Bucket(100000), CopyAcceptance::kBuckets - 1);
}

TEST(CopyAcceptanceTest, ReachMultipliesTheChancesOfEachAgreementLength) {
  CopyAcceptance table;
  for (int i = 0; i < 50; ++i) table.Record(step::DraftSource::kGlobal, 8, 8, 8);
  const std::vector<double> reach = table.Reach(step::DraftSource::kGlobal, 14, 0.5, 4);
  ASSERT_EQ(reach.size(), 4u);
  // Agreement 14 and 15 (bucket 8-15, all continued), then 16 and 17 (no
  // evidence: the prior).
  const double c = table.Continues(step::DraftSource::kGlobal, 14, 0.5);
  EXPECT_GT(c, 0.95);
  EXPECT_DOUBLE_EQ(reach[0], c);
  EXPECT_DOUBLE_EQ(reach[1], c * c);
  EXPECT_DOUBLE_EQ(reach[2], c * c * 0.5);
  EXPECT_DOUBLE_EQ(reach[3], c * c * 0.25);
  // A candidate's reach past its table goes on at its own rate.
  DraftCandidate candidate{0.5, 100};
  candidate.reach = reach;
  EXPECT_DOUBLE_EQ(candidate.Reach(0), 1.0);
  EXPECT_DOUBLE_EQ(candidate.Reach(2), c * c);
  EXPECT_DOUBLE_EQ(candidate.Reach(6), c * c * 0.25 * 0.25);
}

// A sequence whose average acceptance is middling (its copies break at
// fresh one-token matches) but whose copy is known to go on after 40
// agreed tokens drafts across the row curve's jump; one at a fresh match
// drafts nothing, though its average says 0.8.
TEST(AllocateDraftsTest, AContinuingCopyIsPricedByItsAgreementLength) {
  const StepTimeModel model = Staircase();
  SpeculationOptions o = Ngram();
  o.proposer = step::Proposer::kSuffix;
  o.max_draft = 32;
  CopyAcceptance table;
  for (int i = 0; i < 40; ++i) {
    table.Record(step::DraftSource::kRequest, 32, 32, 32);
    table.Record(step::DraftSource::kRequest, 64, 32, 32);
    table.Record(step::DraftSource::kRequest, 1, 4, 0);
  }
  DraftCandidate copying{0.6, 100};
  EXPECT_LE(Allocate({copying}, 128, model, o)[0], 3);  // by its average alone
  copying.reach = table.Reach(step::DraftSource::kRequest, 40, copying.acceptance, 32);
  EXPECT_GE(Allocate({copying}, 128, model, o)[0], 15);
  DraftCandidate fresh{0.8, 100};
  EXPECT_EQ(Allocate({fresh}, 128, model, o)[0], 3);
  fresh.reach = table.Reach(step::DraftSource::kRequest, 1, fresh.acceptance, 32);
  EXPECT_EQ(Allocate({fresh}, 128, model, o)[0], 0);
}

}  // namespace
}  // namespace tandem::scheduler
