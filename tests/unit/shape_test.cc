// `tandem shape`: parsing the Prometheus text, histogram quantiles (as
// Prometheus' histogram_quantile interpolates), and the verdict.
#include "client/shape.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::client {
namespace {

using ::testing::HasSubstr;

// 10 requests: TTFT buckets, 4 colocated and 6 disaggregated.
std::string Exposition(double itl_disaggregated_p99_bucket) {
  std::string t = R"(# HELP tandem_start_time_seconds x
# TYPE tandem_start_time_seconds gauge
tandem_start_time_seconds 1000
tandem_disagg_output_threshold 32
tandem_requests_total{finish_reason="stop",path="colocated"} 4
tandem_requests_total{finish_reason="length",path="disaggregated"} 6
tandem_request_duration_seconds_sum{path="colocated"} 20
tandem_request_duration_seconds_sum{path="disaggregated"} 30
tandem_request_prompt_tokens_bucket{le="16"} 2
tandem_request_prompt_tokens_bucket{le="32"} 6
tandem_request_prompt_tokens_bucket{le="64"} 10
tandem_request_prompt_tokens_bucket{le="+Inf"} 10
tandem_request_prompt_tokens_count 10
tandem_request_generated_tokens_bucket{le="8"} 4
tandem_request_generated_tokens_bucket{le="256"} 10
tandem_request_generated_tokens_bucket{le="+Inf"} 10
tandem_request_generated_tokens_count 10
tandem_time_to_first_token_seconds_bucket{path="colocated",le="0.1"} 4
tandem_time_to_first_token_seconds_bucket{path="colocated",le="1"} 4
tandem_time_to_first_token_seconds_bucket{path="colocated",le="+Inf"} 4
tandem_time_to_first_token_seconds_count{path="colocated"} 4
tandem_time_to_first_token_seconds_bucket{path="disaggregated",le="0.1"} 0
tandem_time_to_first_token_seconds_bucket{path="disaggregated",le="1"} 6
tandem_time_to_first_token_seconds_bucket{path="disaggregated",le="+Inf"} 6
tandem_time_to_first_token_seconds_count{path="disaggregated"} 6
tandem_inter_token_latency_seconds_bucket{path="colocated",le="0.05"} 50
tandem_inter_token_latency_seconds_bucket{path="colocated",le="0.5"} 100
tandem_inter_token_latency_seconds_bucket{path="colocated",le="+Inf"} 100
tandem_inter_token_latency_seconds_count{path="colocated"} 100
)";
  t += "tandem_inter_token_latency_seconds_bucket{path=\"disaggregated\",le=\"0.05\"} 0\n";
  t += "tandem_inter_token_latency_seconds_bucket{path=\"disaggregated\",le=\"" +
       std::to_string(itl_disaggregated_p99_bucket) + "\"} 100\n";
  t += "tandem_inter_token_latency_seconds_bucket{path=\"disaggregated\",le=\"+Inf\"} 100\n";
  t += "tandem_inter_token_latency_seconds_count{path=\"disaggregated\"} 100\n";
  return t;
}

TEST(ShapeTest, QuantilesInterpolateInsideTheBucket) {
  const Metrics m = ParseMetrics(Exposition(0.1));
  const Histogram prompt = m.GetHistogram("tandem_request_prompt_tokens");
  ASSERT_EQ(prompt.buckets.size(), 4u);
  EXPECT_EQ(prompt.count, 10);
  // Rank 5 falls in (16, 32] holding ranks 3..6: 16 + 16 * (5 - 2) / 4 = 28.
  EXPECT_DOUBLE_EQ(prompt.Quantile(0.5), 28);
  EXPECT_DOUBLE_EQ(prompt.Quantile(0.9), 32 + 32 * (9.0 - 6) / 4);
  const Histogram itl = m.GetHistogram("tandem_inter_token_latency_seconds", "path=\"colocated\"");
  EXPECT_DOUBLE_EQ(itl.Quantile(0.99), 0.05 + 0.45 * 49 / 50);
  EXPECT_EQ(Histogram().Quantile(0.5), 0);
}

TEST(ShapeTest, TheReportSaysWhetherDisaggregationPays) {
  const std::string paying = ShapeReport(ParseMetrics(Exposition(0.1)), 1100);
  EXPECT_THAT(paying, HasSubstr("Traffic served: 10 requests in 100 s of uptime"));
  EXPECT_THAT(paying, HasSubstr("prompt tokens per request:     median 28"));
  EXPECT_THAT(paying, HasSubstr("concurrency (mean in flight):  0.50"));
  EXPECT_THAT(paying, HasSubstr("paths: colocated 4 (40%), disaggregated 6 (60%)"));
  EXPECT_THAT(paying, HasSubstr("on at 32 output tokens. paying for itself"));
  const std::string not_paying = ShapeReport(ParseMetrics(Exposition(1.0)), 1100);
  EXPECT_THAT(not_paying, HasSubstr("not paying for itself"));
}

TEST(ShapeTest, UnderTheSloPolicyTheReportGivesAttainment) {
  std::string t = Exposition(0.1);
  t += R"(tandem_policy_info{policy="slo"} 1
tandem_slo_attainment_total{met="true",slo="ttft"} 6
tandem_slo_attainment_total{met="false",slo="ttft"} 4
tandem_slo_attainment_total{met="true",slo="tpot"} 10
tandem_slo_attainment_total{met="false",slo="tpot"} 0
)";
  const std::string report = ShapeReport(ParseMetrics(t), 1100);
  EXPECT_THAT(report, HasSubstr("SLO attainment: TTFT 60% TPOT 100%"));
  EXPECT_THAT(report, HasSubstr("Policy: slo"));
  EXPECT_THAT(report, HasSubstr("TTFT budgets are missed"));
  EXPECT_THAT(report, ::testing::Not(HasSubstr("TPOT budgets are missed")));
}

TEST(ShapeTest, NoTrafficSaysSo) {
  EXPECT_THAT(ShapeReport(ParseMetrics(""), 10), HasSubstr("No finished requests yet"));
}

}  // namespace
}  // namespace tandem::client
