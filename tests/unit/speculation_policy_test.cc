// The draft-length policy: speculation where it pays, none where it does not.
#include "scheduler/speculation_policy.h"

#include <gtest/gtest.h>

namespace tandem::scheduler {
namespace {

SpeculationOptions Ngram(double fixed, double per_token) {
  SpeculationOptions o;
  o.proposer = step::Proposer::kNgram;
  o.max_draft = 8;
  o.cost = {fixed, per_token, 0.0, 0.0};
  return o;
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
  const SpeculationOptions o = Ngram(2.3, 1);
  const std::vector<DraftCandidate> now = {{collapsed, 100}};
  EXPECT_EQ(AllocateDrafts(now, 128, 0, o)[0], 0);
  int idle = 0;
  while (AllocateDrafts(std::vector<DraftCandidate>{{e.rate(), 100}}, 128, 0, o)[0] == 0) {
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
  SpeculationOptions o = Ngram(4.3, 2.3);
  o.cost.per_context = 3.2 / 1000;
  o.cost.per_context_extra = 1.9 / 1000;
  AcceptanceEstimate e(0.5);
  auto allocate = [&] {
    const std::vector<DraftCandidate> one = {{e.rate(), 100, 5000, e.probe_due()}};
    return AllocateDrafts(one, 128, 0, o)[0];
  };
  int32_t steps = 0;
  while (allocate() == 0) {
    e.Idle();
    ASSERT_LT(++steps, 1000) << "never drafts";
  }
  EXPECT_EQ(steps, AcceptanceEstimate::kProbeAfter);
  EXPECT_EQ(allocate(), 1) << "a probe is one token";
  EXPECT_FALSE(
      AllocateDrafts(std::vector<DraftCandidate>{{e.rate(), 100, 5000, false}}, 128, 0, o)[0] > 0)
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
  const std::vector<DraftCandidate> capped = {{0.5, 0, 5000, true}};
  EXPECT_EQ(AllocateDrafts(capped, 128, 0, o)[0], 0);
  const std::vector<DraftCandidate> probing = {{0.5, 100, 5000, true}};
  EXPECT_EQ(AllocateDrafts(probing, 0, 0, o)[0], 0);
}

TEST(AllocateDraftsTest, DraftsLongWhenAcceptanceIsHighAndVerificationCheap) {
  // Batch 1, a step costs 10 + 1 per token: a 0.9 acceptance pays for a long draft.
  const std::vector<DraftCandidate> one = {{0.9, 100}};
  EXPECT_EQ(AllocateDrafts(one, 128, 0, Ngram(10, 1))[0], 8);
  // Poor acceptance: a short draft at most.
  const std::vector<DraftCandidate> poor = {{0.2, 100}};
  EXPECT_LE(AllocateDrafts(poor, 128, 0, Ngram(10, 1))[0], 1);
  // No fixed cost (purely compute-bound): a drafted token costs as much as
  // a decode, and never yields as much: none.
  EXPECT_EQ(AllocateDrafts(one, 128, 0, Ngram(0, 1))[0], 0);
}

TEST(AllocateDraftsTest, SpeculationShrinksAsTheBatchGrows) {
  // Measured shape on the CPU: fixed ~ 2.3 per-token costs.
  int previous = 1 << 30;
  for (int batch : {1, 2, 4, 8, 16}) {
    const std::vector<DraftCandidate> seqs(static_cast<size_t>(batch), {0.8, 100});
    const std::vector<int32_t> k = AllocateDrafts(seqs, 1024, 0, Ngram(2.3, 1));
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
  SpeculationOptions o = Ngram(2.3, 1);
  o.cost.per_context = 0.006;
  o.cost.per_context_extra = 0.0009;
  auto drafted = [&](int batch, int32_t context) {
    const std::vector<DraftCandidate> seqs(static_cast<size_t>(batch), {0.8, 100, context});
    int total = 0;
    for (int32_t x : AllocateDrafts(seqs, 1024, 0, o)) total += x;
    return total;
  };
  EXPECT_EQ(drafted(16, 16), 0);
  EXPECT_GE(drafted(16, 4000), 16);
  EXPECT_GT(drafted(1, 4000), drafted(1, 16));
}

TEST(AllocateDraftsTest, RespectsCapsBudgetAndTheFixedMode) {
  const std::vector<DraftCandidate> seqs = {{0.99, 3}, {0.99, 100}};
  const std::vector<int32_t> k = AllocateDrafts(seqs, 128, 0, Ngram(100, 1));
  EXPECT_EQ(k[0], 3);
  EXPECT_EQ(k[1], 8);
  EXPECT_EQ(
      AllocateDrafts(seqs, 5, 0, Ngram(100, 1))[0] + AllocateDrafts(seqs, 5, 0, Ngram(100, 1))[1],
      5);
  SpeculationOptions fixed = Ngram(1, 1);
  fixed.adaptive = false;
  const std::vector<DraftCandidate> hopeless = {{0.0, 100}, {0.0, 2}};
  EXPECT_EQ(AllocateDrafts(hopeless, 128, 0, fixed), (std::vector<int32_t>{8, 2}));
  SpeculationOptions off = fixed;
  off.proposer = step::Proposer::kNone;
  EXPECT_EQ(AllocateDrafts(hopeless, 128, 0, off), (std::vector<int32_t>{0, 0}));
}

TEST(AllocateDraftsTest, ADraftModelsCostShortensItsDrafts) {
  SpeculationOptions ngram = Ngram(10, 1);
  SpeculationOptions draft = ngram;
  draft.proposer = step::Proposer::kDraftModel;
  draft.cost.draft_fixed = 4;  // each drafting round reads part of the weights
  draft.cost.draft_per_token = 0.3;
  const std::vector<DraftCandidate> one = {{0.8, 100}};
  EXPECT_LT(AllocateDrafts(one, 128, 0, draft)[0], AllocateDrafts(one, 128, 0, ngram)[0]);
}

}  // namespace
}  // namespace tandem::scheduler
