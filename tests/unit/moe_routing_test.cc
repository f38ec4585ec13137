// Mixture-of-experts routing: exact experts and weights from router logits.
#include "engine/model/moe_routing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace tandem::model {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(MoeRoutingTest, EachTokenGoesToItsMostProbableExpertsWithSoftmaxWeights) {
  // Token 0 prefers experts 2 then 0; token 1 prefers 3 then 2.
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f,  //
                                     0.0f, 0.0f, 1.0f, 3.0f};
  ExpertAssignment a;
  RouteTokens(logits.data(), 2, {4, 2, /*normalize=*/false, 1.0f}, a);
  EXPECT_THAT(a.rows[0], ElementsAre(0));
  EXPECT_THAT(a.rows[1], IsEmpty());
  EXPECT_THAT(a.rows[2], ElementsAre(0, 1));
  EXPECT_THAT(a.rows[3], ElementsAre(1));
  const double z0 = std::exp(1.0) + 1.0 + std::exp(2.0) + std::exp(-1.0);
  const double z1 = 1.0 + 1.0 + std::exp(1.0) + std::exp(3.0);
  EXPECT_FLOAT_EQ(a.weights[0][0], static_cast<float>(std::exp(1.0) / z0));
  EXPECT_FLOAT_EQ(a.weights[2][0], static_cast<float>(std::exp(2.0) / z0));
  EXPECT_FLOAT_EQ(a.weights[2][1], static_cast<float>(std::exp(1.0) / z1));
  EXPECT_FLOAT_EQ(a.weights[3][0], static_cast<float>(std::exp(3.0) / z1));
}

TEST(MoeRoutingTest, NormalisedWeightsSumToOneAndAreScaled) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f};
  ExpertAssignment a;
  RouteTokens(logits.data(), 1, {4, 2, /*normalize=*/true, 2.0f}, a);
  const double e1 = std::exp(1.0), e2 = std::exp(2.0);
  EXPECT_FLOAT_EQ(a.weights[0][0], static_cast<float>(2.0 * e1 / (e1 + e2)));
  EXPECT_FLOAT_EQ(a.weights[2][0], static_cast<float>(2.0 * e2 / (e1 + e2)));
}

TEST(MoeRoutingTest, EqualProbabilitiesGoToTheLowerExpert) {
  const std::vector<float> logits = {0.5f, 0.5f, 0.5f, 0.5f};
  ExpertAssignment a;
  RouteTokens(logits.data(), 1, {4, 2, false, 1.0f}, a);
  EXPECT_THAT(a.rows[0], ElementsAre(0));
  EXPECT_THAT(a.rows[1], ElementsAre(0));
  EXPECT_THAT(a.rows[2], IsEmpty());
  EXPECT_THAT(a.rows[3], IsEmpty());
}

TEST(MoeRoutingTest, ATokensRouteDoesNotDependOnTheBatchAndVectorsAreReused) {
  const std::vector<float> batch = {0.3f, -2.0f, 1.7f, 0.9f,  //
                                    4.0f, 1.0f,  0.0f, 2.0f};
  ExpertAssignment both, alone;
  RouteTokens(batch.data(), 2, {4, 2, true, 1.0f}, both);
  RouteTokens(batch.data() + 4, 1, {4, 2, true, 1.0f}, alone);  // token 1 alone
  for (size_t e = 0; e < 4; ++e) {
    for (size_t i = 0; i < both.rows[e].size(); ++i) {
      if (both.rows[e][i] != 1) continue;
      ASSERT_EQ(alone.rows[e].size(), 1u) << "expert " << e;
      EXPECT_EQ(alone.weights[e][0], both.weights[e][i]) << "expert " << e;
    }
  }
  EXPECT_THAT(alone.rows[0], ElementsAre(0));
  EXPECT_THAT(alone.rows[3], ElementsAre(0));
}

}  // namespace
}  // namespace tandem::model
