// Speculative decoding's pure parts: n-gram drafting, verification, and the
// rejection sampler's exactness (a chi-square test against the target
// distribution).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/kernels/sample_row.h"
#include "engine/sampling/sampler.h"
#include "engine/speculative/ngram_proposer.h"
#include "engine/speculative/verify.h"

namespace tandem::speculative {
namespace {

using step::SamplingParams;

TEST(NgramDraftTest, ProposesWhatFollowedTheLatestMatchOfTheLongestSuffix) {
  // ... 1 2 3 [7 8 9] ... 5 2 3 [4 5 6] ... 2 3 -> the latest "2 3" wins,
  // but a longer match "5 2 3" beats it.
  const std::vector<TokenId> tokens = {1, 2, 3, 7, 8, 9, 0, 5, 2, 3, 4, 5, 6, 0, 1, 2, 3};
  // Suffix "1 2 3" (n = 3) matched at the start: 7 8 9 follow.
  EXPECT_EQ(NgramDraft(tokens, 1, 3, 3), (std::vector<TokenId>{7, 8, 9}));
  // With n <= 2 only: the latest "2 3" is at 8..9, followed by 4 5 6.
  EXPECT_EQ(NgramDraft(tokens, 1, 2, 3), (std::vector<TokenId>{4, 5, 6}));
  // The limit bounds the draft, and the sequence's end bounds it too.
  EXPECT_EQ(NgramDraft(tokens, 1, 2, 2), (std::vector<TokenId>{4, 5}));
  EXPECT_EQ(NgramDraft({{4, 4, 4}}, 1, 1, 5), (std::vector<TokenId>{4}));
  // No match, min_n too long, or no room: nothing.
  EXPECT_TRUE(NgramDraft({{1, 2, 3, 4}}, 1, 3, 5).empty());
  EXPECT_TRUE(NgramDraft(tokens, 4, 4, 3).empty());
  EXPECT_TRUE(NgramDraft(tokens, 1, 3, 0).empty());
  EXPECT_TRUE(NgramDraft({{5}}, 1, 3, 3).empty());
}

TEST(NgramDraftTest, CopiesARepeatedLineAfterItsFirstTokens) {
  // Source "a b c d e", then the output starts repeating it.
  const std::vector<TokenId> tokens = {10, 11, 12, 13, 14, 99, 10, 11};
  EXPECT_EQ(NgramDraft(tokens, 1, 3, 8), (std::vector<TokenId>{12, 13, 14, 99, 10, 11}));
}

// Logit rows for a vocabulary of 4 whose argmaxes are `argmax`.
std::vector<float> Rows(const std::vector<TokenId>& argmax) {
  std::vector<float> logits;
  for (TokenId a : argmax) {
    for (TokenId t = 0; t < 4; ++t) logits.push_back(t == a ? 2.0f : 0.0f);
  }
  return logits;
}

TEST(VerifyTest, GreedyAcceptsTheMatchingPrefixAndAddsTheTargetsToken) {
  const SamplingParams greedy;
  // Target argmaxes after each position: 1 2 3 0.
  const std::vector<float> logits = Rows({1, 2, 3, 0});
  Verification all = Verify(logits, 4, Draft{{1, 2, 3}, {}}, greedy, 0);
  EXPECT_EQ(all.tokens, (std::vector<TokenId>{1, 2, 3, 0}));  // bonus token 0
  EXPECT_EQ(all.accepted, 3);
  Verification some = Verify(logits, 4, Draft{{1, 3, 3}, {}}, greedy, 0);
  EXPECT_EQ(some.tokens, (std::vector<TokenId>{1, 2}));  // 2 replaces the rejected 3
  EXPECT_EQ(some.accepted, 1);
  Verification none = Verify(Rows({1}), 4, Draft{}, greedy, 0);
  EXPECT_EQ(none.tokens, (std::vector<TokenId>{1}));
  EXPECT_EQ(none.accepted, 0);
}

TEST(VerifyTest, SampledPointMassDraftsGiveExactlyTheTokensOfPlainSampling) {
  SamplingParams params;
  params.temperature = 1.0f;
  params.seed = 42;
  std::vector<float> logits;
  for (int row = 0; row < 6; ++row) {
    for (TokenId t = 0; t < 4; ++t) logits.push_back(0.3f * static_cast<float>((row + t) % 4));
  }
  // What sampling without speculation gives for draws 7..12.
  std::vector<TokenId> plain;
  for (int row = 0; row < 6; ++row) {
    plain.push_back(sampling::Sample(std::span<const float>(logits).subspan(row * 4, 4), params,
                                     7 + static_cast<uint64_t>(row)));
  }
  // A draft equal to those tokens is accepted whole; one that departs at i
  // yields plain[0..i] and stops.
  Draft exact{{plain.begin(), plain.begin() + 5}, {}};
  EXPECT_EQ(Verify(logits, 4, exact, params, 7).tokens, plain);
  for (size_t i = 0; i < 5; ++i) {
    Draft wrong = exact;
    wrong.tokens[i] = (wrong.tokens[i] + 1) % 4;
    Verification v = Verify(std::span<const float>(logits).first((5 + 1) * 4), 4, wrong, params, 7);
    EXPECT_EQ(v.accepted, static_cast<int32_t>(i));
    EXPECT_EQ(v.tokens, std::vector<TokenId>(plain.begin(), plain.begin() + i + 1));
  }
}

// What a device verifies from (its own sample at every row) gives exactly
// Verify()'s tokens, for greedy and sampled point-mass drafts, drafts right,
// wrong at each place, and empty.
TEST(VerifyTest, VerifyingFromEveryRowsSampleIsVerify) {
  std::vector<float> logits;
  for (int row = 0; row < 6; ++row) {
    for (TokenId t = 0; t < 4; ++t) {
      logits.push_back(0.4f * static_cast<float>((row * 3 + t * 5) % 7));
    }
  }
  SamplingParams sampled;
  sampled.temperature = 1.3f;
  sampled.seed = 5;
  int compared = 0;
  for (const SamplingParams& params : {SamplingParams{}, sampled}) {
    for (uint64_t draw_index = 0; draw_index < 20; ++draw_index) {
      std::vector<TokenId> samples;
      for (int row = 0; row < 6; ++row) {
        samples.push_back(sampling::Sample(std::span<const float>(logits).subspan(row * 4, 4),
                                           params, draw_index + static_cast<uint64_t>(row)));
      }
      for (size_t length = 0; length <= 5; ++length) {
        for (size_t wrong = 0; wrong <= length; ++wrong) {
          Draft draft{{samples.begin(), samples.begin() + static_cast<long>(length)}, {}};
          if (wrong < length) draft.tokens[wrong] = (draft.tokens[wrong] + 1) % 4;
          ASSERT_FALSE(NeedsTargetDistribution(draft, params));
          const std::span<const float> rows =
              std::span<const float>(logits).first((length + 1) * 4);
          const Verification expected = Verify(rows, 4, draft, params, draw_index);
          const Verification got =
              VerifySampled(std::span<const TokenId>(samples).first(length + 1), draft);
          EXPECT_EQ(got.tokens, expected.tokens);
          EXPECT_EQ(got.accepted, expected.accepted);
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 2 * 20 * 21);
}

// A share of a row (what a device copies for a drafted token) gives the
// probability Probabilities() gives the token, bit for bit, and the sample
// SampleRow draws.
TEST(VerifyTest, AShareIsTheTokensProbabilityOfTheWholeRow) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::vector<float> row(300);
  int inside = 0, outside = 0;
  for (int trial = 0; trial < 60; ++trial) {
    for (float& l : row) l = normal(rng);
    SamplingParams params;
    params.temperature = trial % 5 == 0 ? 0.0f : 0.4f + 0.1f * static_cast<float>(trial % 9);
    params.top_k = (trial % 3) * 20;
    params.top_p = trial % 2 == 0 ? 1.0f : 0.75f;
    const std::vector<float> p = sampling::Probabilities(row, params);
    const kernels::RowDraw draw = sampling::RowDrawOf(params, 0.37);
    for (TokenId token = 0; token < 300; token += 7) {
      kernels::NucleusShare share;
      const TokenId sampled = kernels::SampleRowWithShare(row, draw, token, &share);
      EXPECT_EQ(sampled, kernels::SampleRow(row, draw));
      ASSERT_GT(share.mass, 0u);
      EXPECT_EQ(sampling::ShareProbability(share), p[static_cast<size_t>(token)])
          << "trial " << trial << ", token " << token;
      (share.weight > 0 ? inside : outside) += 1;
    }
  }
  EXPECT_GT(inside, 100);
  EXPECT_GT(outside, 100) << "tokens outside the cuts have share 0";
}

// Verifying a draft model's sampled draft from the drafted tokens' shares,
// the bonus row's sample and the one rejected row (where the shares alone
// say the draft stops) gives exactly Verify()'s tokens from every row.
TEST(VerifyTest, VerifyingFromSharesIsVerify) {
  constexpr size_t kVocab = 40;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  int compared = 0, all_accepted = 0, rejected_drafts = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const size_t k = 1 + static_cast<size_t>(trial % 5);
    SamplingParams params;
    params.temperature = 0.6f + 0.2f * static_cast<float>(trial % 4);
    params.top_k = trial % 3 == 0 ? 12 : 0;
    params.top_p = trial % 2 == 0 ? 1.0f : 0.9f;
    params.seed = static_cast<uint64_t>(trial);
    std::vector<float> logits((k + 1) * kVocab);
    for (float& l : logits) l = normal(rng);
    // The draft model's distributions: near the target's (so most drafts
    // pass) or random; its tokens drawn from them.
    Draft draft;
    for (size_t i = 0; i < k; ++i) {
      std::vector<float> q = sampling::Probabilities(
          std::span<const float>(logits).subspan(i * kVocab, kVocab), params);
      double total = 0.0;
      for (float& x : q) {
        x = trial % 2 == 0 ? x + 0.05f * uniform(rng) : uniform(rng);
        total += x;
      }
      for (float& x : q) x = static_cast<float>(x / total);
      draft.tokens.push_back(sampling::DrawFrom(
          q, SpeculativeDraw(params.seed, DrawStream::kDraftSample, static_cast<uint64_t>(i))));
      draft.probabilities.push_back(std::move(q));
    }
    ASSERT_TRUE(NeedsTargetDistribution(draft, params));
    const uint64_t draw_index = 3 * static_cast<uint64_t>(trial);
    std::vector<kernels::NucleusShare> shares(k);
    for (size_t i = 0; i < k; ++i) {
      kernels::SampleRowWithShare(std::span<const float>(logits).subspan(i * kVocab, kVocab),
                                  sampling::RowDrawOf(params, 0.5), draft.tokens[i], &shares[i]);
    }
    const TokenId bonus = sampling::Sample(
        std::span<const float>(logits).subspan(k * kVocab, kVocab), params, draw_index + k);
    const Verification expected =
        Verify(logits, static_cast<int32_t>(kVocab), draft, params, draw_index);
    // Step 1 says where the draft stops; step 2 gets that row alone.
    const size_t stop = AcceptedFromShares(shares, draft, params, draw_index);
    EXPECT_EQ(stop, static_cast<size_t>(expected.accepted)) << "trial " << trial;
    const std::span<const float> rejected =
        stop == k ? std::span<const float>()
                  : std::span<const float>(logits).subspan(stop * kVocab, kVocab);
    const Verification got = VerifyFromShares(shares, bonus, rejected, draft, params, draw_index);
    EXPECT_EQ(got.tokens, expected.tokens) << "trial " << trial;
    EXPECT_EQ(got.accepted, expected.accepted) << "trial " << trial;
    (stop == k ? all_accepted : rejected_drafts) += 1;
    ++compared;
  }
  EXPECT_EQ(compared, 400);
  EXPECT_GT(all_accepted, 40);
  EXPECT_GT(rejected_drafts, 40);
}

TEST(VerifyTest, OnlySampledDraftsFromADistributionNeedTheTargetsDistribution) {
  SamplingParams sampled;
  sampled.temperature = 0.7f;
  const Draft point{{1, 2}, {}};
  const Draft distribution{{1}, {std::vector<float>{0.1f, 0.9f, 0.0f, 0.0f}}};
  EXPECT_FALSE(NeedsTargetDistribution(point, sampled));
  EXPECT_FALSE(NeedsTargetDistribution(distribution, SamplingParams{})) << "greedy";
  EXPECT_TRUE(NeedsTargetDistribution(distribution, sampled));
}

// Chi-square statistic of observed counts against expected probabilities.
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double chi = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double expected = p[i] * n;
    chi += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi;
}

// The rejection sampler's output is distributed as the target p for any
// draft distribution q: draw x ~ q, accept with min(1, p/q), else draw from
// the residual. 200,000 seeded trials per pair; the statistic has at most 5
// degrees of freedom, and 20.52 is its 0.999 quantile for 5 (smaller for
// fewer), so each case fails by chance with probability below 1e-3 — and
// with fixed seeds the outcome is the same on every run.
TEST(RejectionSamplingTest, OutputFollowsTheTargetDistributionForAnyDraft) {
  const std::vector<std::vector<float>> targets = {
      {0.5f, 0.2f, 0.15f, 0.1f, 0.05f, 0.0f},
      {0.05f, 0.05f, 0.1f, 0.1f, 0.2f, 0.5f},
      {0.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0.0f},
  };
  const std::vector<std::vector<float>> drafts = {
      {0.5f, 0.2f, 0.15f, 0.1f, 0.05f, 0.0f},  // equal to the first target
      {1.0f / 6, 1.0f / 6, 1.0f / 6, 1.0f / 6, 1.0f / 6, 1.0f / 6},
      {0.0f, 0.0f, 0.0f, 0.1f, 0.1f, 0.8f},  // disjoint support from some targets
      {0.9f, 0.1f, 0.0f, 0.0f, 0.0f, 0.0f},
  };
  constexpr int kTrials = 200000;
  constexpr double kCritical = 20.52;
  for (size_t ti = 0; ti < targets.size(); ++ti) {
    for (size_t di = 0; di < drafts.size(); ++di) {
      const std::vector<float>& p = targets[ti];
      const std::vector<float>& q = drafts[di];
      std::vector<int> counts(p.size(), 0);
      int accepted = 0;
      const uint64_t seed = 1000 * ti + di;
      for (int n = 0; n < kTrials; ++n) {
        const auto index = static_cast<uint64_t>(n);
        const TokenId x =
            sampling::DrawFrom(q, SpeculativeDraw(seed, DrawStream::kDraftSample, index));
        TokenId out;
        if (sampling::AcceptDraft(p, q, x, SpeculativeDraw(seed, DrawStream::kAccept, index))) {
          out = x;
          ++accepted;
        } else {
          out = sampling::DrawResidual(p, q, SpeculativeDraw(seed, DrawStream::kResidual, index));
        }
        ++counts[static_cast<size_t>(out)];
      }
      const std::vector<double> expected(p.begin(), p.end());
      EXPECT_LT(ChiSquare(counts, expected, kTrials), kCritical)
          << "target " << ti << ", draft " << di;
      // The acceptance rate is sum(min(p, q)) (the overlap).
      double overlap = 0.0;
      for (size_t i = 0; i < p.size(); ++i) overlap += std::min(p[i], q[i]);
      EXPECT_NEAR(static_cast<double>(accepted) / kTrials, overlap, 0.01)
          << "target " << ti << ", draft " << di;
    }
  }
}

// The test above can fail: a sampler that skipped the residual (drew from
// p after a rejection) is biased toward what q over-proposes.
TEST(RejectionSamplingTest, TheChiSquareTestCatchesABiasedSampler) {
  const std::vector<float> p = {0.5f, 0.2f, 0.15f, 0.1f, 0.05f, 0.0f};
  const std::vector<float> q = {0.9f, 0.1f, 0.0f, 0.0f, 0.0f, 0.0f};
  constexpr int kTrials = 200000;
  std::vector<int> counts(p.size(), 0);
  for (int n = 0; n < kTrials; ++n) {
    const auto index = static_cast<uint64_t>(n);
    const TokenId x = sampling::DrawFrom(q, SpeculativeDraw(3, DrawStream::kDraftSample, index));
    const TokenId out =
        sampling::AcceptDraft(p, q, x, SpeculativeDraw(3, DrawStream::kAccept, index))
            ? x
            : sampling::DrawFrom(p, SpeculativeDraw(3, DrawStream::kResidual, index));
    ++counts[static_cast<size_t>(out)];
  }
  EXPECT_GT(ChiSquare(counts, std::vector<double>(p.begin(), p.end()), kTrials), 20.52);
}

TEST(ProbabilitiesTest, MatchesWhatSampleDraws) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f, 2.5f, -1.0f};
  for (SamplingParams params : {SamplingParams{0.0f, 0, 1.0f, 1}, SamplingParams{0.7f, 0, 1.0f, 1},
                                SamplingParams{1.0f, 3, 1.0f, 1}, SamplingParams{1.3f, 0, 0.8f, 1},
                                SamplingParams{1.0f, 4, 0.6f, 1}}) {
    const std::vector<float> p = sampling::Probabilities(logits, params);
    std::vector<int> counts(logits.size(), 0);
    constexpr int kTrials = 100000;
    for (int n = 0; n < kTrials; ++n) {
      ++counts[static_cast<size_t>(sampling::Sample(logits, params, static_cast<uint64_t>(n)))];
    }
    double sum = 0.0;
    for (float x : p) sum += x;
    EXPECT_NEAR(sum, 1.0, 1e-6);
    EXPECT_LT(ChiSquare(counts, std::vector<double>(p.begin(), p.end()), kTrials), 20.52)
        << "temperature " << params.temperature << " top_k " << params.top_k << " top_p "
        << params.top_p;
  }
}

}  // namespace
}  // namespace tandem::speculative
