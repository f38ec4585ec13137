#include "engine/sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

namespace tandem::sampling {
namespace {

step::SamplingParams Params(float temperature, int top_k = 0, float top_p = 1.0f,
                            uint64_t seed = 1) {
  step::SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

TEST(SamplerTest, GreedyTakesTheArgmaxAndTheLowestIdOnTies) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(Sample(logits, Params(0.0f), 0), 1);
}

TEST(SamplerTest, SameSeedAndDrawGiveTheSameTokenDifferentSeedsDiffer) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  int differ = 0;
  for (uint64_t draw = 0; draw < 50; ++draw) {
    const auto a = Sample(logits, Params(1.0f, 0, 1.0f, 42), draw);
    EXPECT_EQ(a, Sample(logits, Params(1.0f, 0, 1.0f, 42), draw));
    differ += a != Sample(logits, Params(1.0f, 0, 1.0f, 43), draw);
  }
  EXPECT_GT(differ, 25);
}

TEST(SamplerTest, TopKOneAndTinyTopPAreGreedy) {
  const std::vector<float> logits = {0.1f, 0.2f, 2.0f, 1.9f, -3.0f};
  for (uint64_t draw = 0; draw < 20; ++draw) {
    EXPECT_EQ(Sample(logits, Params(1.0f, 1), draw), 2);
    EXPECT_EQ(Sample(logits, Params(1.0f, 0, 1e-6f), draw), 2);
  }
}

TEST(SamplerTest, TopKNeverReturnsATokenOutsideTheTopK) {
  std::vector<float> logits = {5.0f, 4.9f, 4.8f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (uint64_t draw = 0; draw < 500; ++draw) {
    EXPECT_LT(Sample(logits, Params(5.0f, 3), draw), 3);
  }
}

// Pearson's chi-square test of the empirical distribution against
// softmax(logits / T) restricted by top-p. The draws are seeded, so the test
// is deterministic; with 4 degrees of freedom the threshold 18.47 is the
// 99.9% quantile, i.e. a correct sampler would fail with probability 0.001
// for a random seed, and never for this fixed one.
TEST(SamplerTest, DrawsFollowTheTemperatureAndTopPDistribution) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -6.0f};
  const float temperature = 0.8f, top_p = 0.97f;
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < p.size(); ++i) total += p[i] = std::exp(logits[i] / temperature);
  for (double& v : p) v /= total;
  // top-p keeps the shortest prefix reaching 0.97: tokens 0..4 here.
  double kept = 0;
  size_t cut = 0;
  for (; cut < p.size() && kept < top_p; ++cut) kept += p[cut];
  ASSERT_EQ(cut, 5u);
  const int n = 40000;
  std::map<int, int> counts;
  for (int draw = 0; draw < n; ++draw)
    ++counts[Sample(logits, Params(temperature, 0, top_p, 7), draw)];
  EXPECT_EQ(counts.count(5), 0u) << "a token outside the nucleus was drawn";
  double chi2 = 0;
  for (size_t i = 0; i < cut; ++i) {
    const double expected = n * p[i] / kept;
    chi2 += std::pow(counts[static_cast<int>(i)] - expected, 2) / expected;
  }
  EXPECT_LT(chi2, 18.47);
}

TEST(SamplerTest, UniformDrawsAreInTheUnitInterval) {
  for (uint64_t i = 0; i < 1000; ++i) {
    const double u = UniformDraw(99, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

// Probabilities() is the distribution Sample() draws from: over many draws,
// each token's frequency matches it (the draw is the inverse CDF, so a fine
// grid of uniform numbers hits each token in proportion to its probability).
TEST(SamplerTest, ProbabilitiesAreWhatTheDrawsFollow) {
  std::vector<float> logits(300);
  for (size_t i = 0; i < logits.size(); ++i)
    logits[i] = std::cos(0.37f * static_cast<float>(i)) * 4;
  for (const step::SamplingParams& params :
       {Params(1.0f), Params(0.7f, 20), Params(1.3f, 0, 0.8f), Params(0.9f, 50, 0.6f)}) {
    const std::vector<float> p = Probabilities(logits, params);
    const int grid = 100000;
    std::vector<int> counts(logits.size());
    for (int j = 0; j < grid; ++j) {
      ++counts[static_cast<size_t>(SampleWithDraw(logits, params, (j + 0.5) / grid))];
    }
    double total = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      total += p[i];
      EXPECT_NEAR(counts[i] / static_cast<double>(grid), p[i], 1.5 / grid + 1e-6) << "token " << i;
    }
    EXPECT_NEAR(total, 1.0, 1e-5);
  }
}

}  // namespace
}  // namespace tandem::sampling
