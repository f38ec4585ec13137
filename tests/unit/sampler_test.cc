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

// The row's k largest logits and their ids, largest first, lower id first
// among equal logits: what a device hands SampleFromTopK.
void TopK(const std::vector<float>& logits, size_t k, std::vector<float>* values,
          std::vector<int32_t>* ids) {
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::partial_sort(
      order.begin(), order.begin() + static_cast<long>(k), order.end(),
      [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
  ids->assign(order.begin(), order.begin() + static_cast<long>(k));
  values->clear();
  for (int32_t id : *ids) values->push_back(logits[static_cast<size_t>(id)]);
}

TEST(SamplerTest, SamplingFromTheTopKCandidatesGivesTheFullRowsToken) {
  std::mt19937 rng(4242);
  std::normal_distribution<float> n(0.0f, 3.0f);
  int checked = 0;
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<float> logits(5000);
    for (float& l : logits) l = n(rng);
    // Ties at the top and across the top-k boundary.
    logits[17] = logits[4000] = 30.0f;
    const auto boundary = static_cast<size_t>(trial % 7);
    for (size_t i = 0; i < 3; ++i) logits[100 + 50 * i] = 8.0f - static_cast<float>(boundary);
    for (const int32_t top_k : {1, 5, 40}) {
      for (const float top_p : {1.0f, 0.9f, 0.3f}) {
        for (const float temperature : {0.0f, 0.4f, 0.8f, 1.7f}) {
          const step::SamplingParams params = Params(temperature, top_k, top_p, 11);
          const size_t k = 64;  // the device's candidates: at least top_k
          ASSERT_TRUE(CanSampleFromTopK(params, logits.size(), k));
          std::vector<float> values;
          std::vector<int32_t> ids;
          TopK(logits, k, &values, &ids);
          for (int draw = 0; draw < 25; ++draw) {
            const double u = UniformDraw(trial, static_cast<uint64_t>(draw));
            ASSERT_EQ(SampleFromTopK(values, ids, logits.size(), params, u),
                      SampleWithDraw(logits, params, u))
                << "top_k " << top_k << " top_p " << top_p << " temperature " << temperature;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 40 * 3 * 3 * 4 * 25);
}

TEST(SamplerTest, TopKCandidatesServeOnlyGreedyAndTopKSampling) {
  EXPECT_TRUE(CanSampleFromTopK(Params(0.0f), 1000, 1));
  EXPECT_TRUE(CanSampleFromTopK(Params(0.8f, 40, 0.95f), 1000, 64));
  EXPECT_FALSE(CanSampleFromTopK(Params(0.8f, 100, 0.95f), 1000, 64)) << "top_k above k";
  EXPECT_FALSE(CanSampleFromTopK(Params(0.8f, 0, 0.95f), 1000, 64)) << "no top-k: whole row";
  EXPECT_FALSE(CanSampleFromTopK(Params(0.8f, 1000, 1.0f), 1000, 2000)) << "top_k = vocab";
}

}  // namespace
}  // namespace tandem::sampling
