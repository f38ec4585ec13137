// The sampling definition every backend implements (sample_row.h), checked
// against an independent reference: the library's exp in long double and
// the top-k / top-p rules written out directly.
#include "engine/kernels/sample_row.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "engine/kernels/cpu/cpu_backend.h"
#include "engine/kernels/sampling_arithmetic.h"

namespace tandem::kernels {
namespace {

namespace sa = sampling_arithmetic;

TEST(SamplingArithmeticTest, ExpNonPositiveMatchesTheLibraryExp) {
  EXPECT_EQ(sa::ExpNonPositive(0.0), 1.0);
  EXPECT_EQ(sa::ExpNonPositive(-40.0), 0.0);
  EXPECT_EQ(sa::ExpNonPositive(-1e9), 0.0);
  EXPECT_EQ(sa::ExpNonPositive(std::nan("")), 0.0);
  double worst = 0;
  for (int i = 1; i < 400000; ++i) {
    const double x = -40.0 * i / 400000.0 + 1e-12 * (i % 7);
    const long double exact = std::exp(static_cast<long double>(x));
    const double relative = static_cast<double>(std::fabs((sa::ExpNonPositive(x) - exact) / exact));
    worst = std::max(worst, relative);
  }
  EXPECT_LT(worst, 2e-15);
}

TEST(SamplingArithmeticTest, WeightsAreTheScaledExponentialRoundedDown) {
  EXPECT_EQ(sa::Weight(3.5f, 3.5f, 1.0), uint64_t{1} << 43);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> logit(-20.0f, 5.0f);
  for (int i = 0; i < 100000; ++i) {
    const float max = 5.0f, l = logit(rng);
    const double inverse_temperature = sa::InverseTemperature(0.8f);
    const long double exact =
        std::exp((static_cast<long double>(l) - max) * inverse_temperature) * 0x1p43L;
    const uint64_t w = sa::Weight(l, max, inverse_temperature);
    // Equal to floor(exact) unless exact is within rounding of an integer.
    EXPECT_LE(std::fabs(static_cast<long double>(w) - std::floor(exact)), 1.0L) << l;
  }
  EXPECT_EQ(sa::Weight(-100.0f, 0.0f, 1.0), 0u);
}

TEST(SamplingArithmeticTest, RankKeysOrderByLogitThenLowerId) {
  EXPECT_GT(sa::RankKey(1.0f, 9), sa::RankKey(0.5f, 0));
  EXPECT_GT(sa::RankKey(-1.0f, 9), sa::RankKey(-2.0f, 0));
  EXPECT_GT(sa::RankKey(0.5f, 3), sa::RankKey(0.5f, 4));
  EXPECT_EQ(sa::RankKey(0.0f, 5), sa::RankKey(-0.0f, 5));
  EXPECT_GT(sa::RankKey(-1e30f, 0), sa::RankKey(std::nanf(""), 0));
}

TEST(SamplingArithmeticTest, NucleusMassAndDrawTargetStayInRange) {
  EXPECT_EQ(sa::NucleusMass(1.0f, 1000), 1000u);
  EXPECT_EQ(sa::NucleusMass(0.5f, 1001), 501u);  // ceil(500.5)
  EXPECT_EQ(sa::NucleusMass(1e-9f, 1000), 1u);
  EXPECT_EQ(sa::NucleusMass(0.0f, 1000), 1u);
  EXPECT_EQ(sa::NucleusMass(-0.5f, 1000), 1u) << "out of contract, but the same on every device";
  EXPECT_EQ(sa::DrawTarget(0.0, 1000), 0u);
  EXPECT_EQ(sa::DrawTarget(0.9995, 1000), 999u);
  EXPECT_EQ(sa::DrawTarget(1.0 - 0x1p-53, 1000), 999u);
  EXPECT_LT(sa::DrawTarget(1.0 - 0x1p-53, uint64_t{1} << 62), uint64_t{1} << 62);
}

// The reference distribution: softmax(l / T) over the k most likely tokens
// (ties by lower id), cut to the shortest most-likely prefix reaching top_p
// of their probability, renormalised; in long double with the library exp.
std::vector<long double> Reference(const std::vector<float>& row, float temperature, int top_k,
                                   float top_p, bool* near_a_boundary) {
  std::vector<int32_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  if (top_k > 0 && static_cast<size_t>(top_k) < row.size())
    order.resize(static_cast<size_t>(top_k));
  const long double max = row[static_cast<size_t>(order[0])];
  std::vector<long double> w(row.size(), 0.0L);
  long double total = 0;
  for (int32_t id : order) total += w[id] = std::exp((row[id] - max) / temperature);
  size_t cut = order.size();
  *near_a_boundary = false;
  if (top_p < 1.0f) {
    long double kept = 0;
    for (cut = 0; cut < order.size() && kept < top_p * total; ++cut) {
      kept += w[static_cast<size_t>(order[cut])];
      if (std::fabs(kept - top_p * total) < 1e-9L * total) *near_a_boundary = true;
    }
  }
  std::vector<long double> p(row.size(), 0.0L);
  long double nucleus = 0;
  for (size_t i = 0; i < cut; ++i) nucleus += w[static_cast<size_t>(order[i])];
  for (size_t i = 0; i < cut; ++i) {
    p[static_cast<size_t>(order[i])] = w[static_cast<size_t>(order[i])] / nucleus;
  }
  return p;
}

// The draw is the inverse CDF of the nucleus: a fine grid of uniform numbers
// hits each token in proportion to its reference probability (within one
// grid step and the 2^-43 weight resolution), and never a token outside.
TEST(SampleRowTest, DrawsAreTheInverseCdfOfTheReferenceDistribution) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  int checked = 0;
  // A small row on a fine grid; a wider one (its nucleus outgrows the 64
  // tokens ranked first) on a coarser grid.
  for (const auto& [vocab, grid] : {std::pair{size_t{9}, 200000}, std::pair{size_t{400}, 10000}}) {
    std::vector<float> row(vocab);
    for (float& l : row) l = normal(rng);
    row[vocab / 2] = row[1] = 6.0f;  // a shared maximum
    row[3] = row[vocab - 2] = 1.0f;  // ties elsewhere
    for (float temperature : {0.5f, 1.0f, 1.6f}) {
      for (int top_k : {0, 1, 3, 100}) {
        for (float top_p : {1.0f, 0.9f, 0.4f}) {
          bool near_a_boundary = false;
          const std::vector<long double> p =
              Reference(row, temperature, top_k, top_p, &near_a_boundary);
          if (near_a_boundary) continue;  // the cut may fall either way
          RowDraw draw;
          draw.temperature = temperature;
          draw.top_k = top_k;
          draw.top_p = top_p;
          std::vector<int> counts(vocab);
          for (int j = 0; j < grid; ++j) {
            draw.u = (j + 0.5) / grid;
            ++counts[static_cast<size_t>(SampleRow(row, draw))];
          }
          for (size_t i = 0; i < vocab; ++i) {
            if (p[i] == 0.0L) {
              ASSERT_EQ(counts[i], 0) << "token " << i << " is outside the nucleus";
            } else {
              ASSERT_NEAR(counts[i] / static_cast<double>(grid), static_cast<double>(p[i]),
                          1.5 / grid)
                  << "token " << i << ", vocab " << vocab << ", temperature " << temperature
                  << ", top_k " << top_k << ", top_p " << top_p;
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GE(checked, 60);
}

TEST(SampleRowTest, GreedyAndOneTokenRowsTakeTheLowestIdOfTheMaximum) {
  const std::vector<float> row = {0.5f, 3.0f, -1.0f, 3.0f};
  RowDraw greedy;
  EXPECT_EQ(SampleRow(row, greedy), 1);
  RowDraw hot;
  hot.temperature = 1.0f;
  hot.u = 0.99;
  EXPECT_EQ(SampleRow(std::vector<float>{7.0f}, hot), 0);
  hot.top_k = 1;
  EXPECT_EQ(SampleRow(row, hot), 1) << "top_k 1 keeps the lower id of a tie";
}

// Infinite logits are in contract (NaN is not): +inf tokens share all the
// probability, a row of -inf is uniform, and no draw finds an empty nucleus.
TEST(SampleRowTest, InfiniteLogitsKeepAPositiveMass) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> one_infinite = {0.0f, inf, 1.0f};
  const std::vector<float> two_infinite = {inf, 0.0f, inf};
  const std::vector<float> all_negative = {-inf, -inf, -inf, -inf};
  RowDraw draw;
  draw.temperature = 1.0f;
  for (float top_p : {1.0f, 0.9f, 0.4f}) {
    draw.top_p = top_p;
    for (double u : {0.0, 0.3, 0.7, 1.0 - 0x1p-53}) {
      draw.u = u;
      EXPECT_EQ(SampleRow(one_infinite, draw), 1) << "u " << u;
      const int32_t of_two = SampleRow(two_infinite, draw);
      // Half the mass each: top_p 0.4 keeps the lower id alone.
      EXPECT_EQ(of_two, u < 0.5 || top_p < 0.5f ? 0 : 2) << "u " << u << " top_p " << top_p;
    }
  }
  draw.top_p = 1.0f;
  for (int i = 0; i < 4; ++i) {
    draw.u = (i + 0.5) / 4;
    EXPECT_EQ(SampleRow(all_negative, draw), i);
  }
  const Nucleus nucleus = NucleusOf(one_infinite, draw);
  EXPECT_EQ(nucleus.mass, uint64_t{1} << 43);
}

// The nucleus a top-p cut keeps: the ranked prefix, sized beyond the 64
// tokens the host ranks first (flat logits need hundreds).
TEST(SampleRowTest, WideNucleiAreTheRankedPrefix) {
  std::vector<float> row(5000);
  for (size_t i = 0; i < row.size(); ++i) row[i] = 0.001f * static_cast<float>(i % 997);
  RowDraw draw;
  draw.temperature = 1.0f;
  draw.top_p = 0.5f;
  const Nucleus nucleus = NucleusOf(row, draw);
  ASSERT_GT(nucleus.ids.size(), 64u);
  EXPECT_TRUE(std::is_sorted(nucleus.ids.begin(), nucleus.ids.end()));
  // Every kept token outranks every dropped one.
  float lowest_kept = 1e9f;
  for (int32_t id : nucleus.ids) lowest_kept = std::min(lowest_kept, row[static_cast<size_t>(id)]);
  size_t above = 0;
  for (float l : row) above += l > lowest_kept;
  EXPECT_LE(above, nucleus.ids.size());
  uint64_t mass = 0;
  for (uint64_t w : nucleus.weights) mass += w;
  EXPECT_EQ(mass, nucleus.mass);
}

TEST(SampleRowTest, LogprobsAreTheLogSoftmaxWithAlternativesInRankOrder) {
  const std::vector<float> row = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, 2.0f};
  long double z = 0;
  for (float l : row) z += std::exp(static_cast<long double>(l));
  auto reference = [&](size_t id) { return static_cast<double>(row[id] - std::log(z)); };
  const RowLogprobs got = LogprobsOf(row, 4, 4);
  EXPECT_NEAR(got.token, reference(4), 1e-6);
  const std::vector<int32_t> order = {1, 3, 5, 0};  // the tie 1, 3 by lower id
  ASSERT_EQ(got.top.size(), order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(got.top[i].first, order[i]);
    EXPECT_NEAR(got.top[i].second, reference(static_cast<size_t>(order[i])), 1e-6);
  }
  EXPECT_EQ(LogprobsOf(row, 0, 100).top.size(), row.size());
  EXPECT_TRUE(LogprobsOf(row, 0, 0).top.empty());
}

// Backend::SampleRows is SampleRow row by row on the CPU backend, and
// Backend::LogprobRows LogprobsOf.
TEST(SampleRowTest, CpuBackendSamplesEachRowAsSampleRow) {
  cpu::CpuBackend backend(1);
  const int64_t rows = 6, cols = 3000;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> host(static_cast<size_t>(rows * cols));
  for (float& l : host) l = normal(rng);
  const Matrix x{host.data(), rows, cols};
  std::vector<RowDraw> draws(static_cast<size_t>(rows));
  for (size_t r = 0; r < draws.size(); ++r) {
    draws[r].temperature = r == 0 ? 0.0f : 0.5f * static_cast<float>(r);
    draws[r].top_k = static_cast<int32_t>(r % 3) * 50;
    draws[r].top_p = r % 2 == 0 ? 1.0f : 0.8f;
    draws[r].u = 0.15 * static_cast<double>(r);
  }
  std::vector<int32_t> tokens(draws.size());
  backend.SampleRows(x, draws, tokens);
  for (size_t r = 0; r < draws.size(); ++r) {
    EXPECT_EQ(tokens[r],
              SampleRow(std::span<const float>(host).subspan(r * static_cast<size_t>(cols), cols),
                        draws[r]))
        << "row " << r;
  }
  // With shares: the same tokens, and each asked-for token's share as
  // SampleRowWithShare gives it ({0, 1} where none is asked for).
  const std::vector<int32_t> share_tokens = {5, -1, tokens[2], 2999, -1, tokens[5]};
  std::vector<int32_t> shared_tokens(draws.size());
  std::vector<NucleusShare> shares(draws.size(), NucleusShare{7, 7});
  backend.SampleRowsWithShares(x, draws, shared_tokens, share_tokens, shares);
  EXPECT_EQ(shared_tokens, tokens);
  for (size_t r = 0; r < draws.size(); ++r) {
    NucleusShare expected;
    if (share_tokens[r] >= 0) {
      SampleRowWithShare(std::span<const float>(host).subspan(r * static_cast<size_t>(cols), cols),
                         draws[r], share_tokens[r], &expected);
    }
    EXPECT_EQ(shares[r].weight, expected.weight) << "row " << r;
    EXPECT_EQ(shares[r].mass, expected.mass) << "row " << r;
  }
  EXPECT_EQ(shares[0].mass, 1u) << "a greedy row's share is its point mass";
  EXPECT_GT(shares[2].weight, 0u) << "a sampled token is inside its nucleus";
  const int top = 3;
  const size_t k = top;
  std::vector<float> token_logprobs(draws.size()), top_logprobs(draws.size() * k);
  std::vector<int32_t> top_ids(draws.size() * k);
  backend.LogprobRows(x, tokens, top, token_logprobs, top_ids, top_logprobs);
  for (size_t r = 0; r < draws.size(); ++r) {
    const RowLogprobs expected = LogprobsOf(
        std::span<const float>(host).subspan(r * static_cast<size_t>(cols), cols), tokens[r], top);
    EXPECT_EQ(token_logprobs[r], expected.token);
    for (size_t i = 0; i < k; ++i) {
      EXPECT_EQ(top_ids[r * k + i], expected.top[i].first);
      EXPECT_EQ(top_logprobs[r * k + i], expected.top[i].second);
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
