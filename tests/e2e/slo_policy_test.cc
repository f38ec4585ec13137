// The SLO policy (the default) end to end: a request's latency budget is
// taken and counted against (tandem_slo_attainment_total), GetLoad reports
// the streams' slack while they decode, the step-time model's predictions
// and error are exported, --admission=slo refuses a request predicted to
// miss its TTFT before any compute is spent (and takes one whose own budget
// allows it), and the policy's flags are checked at start-up.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/e2e/daemon.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

double Attainment(const std::string& metrics, const std::string& slo, bool met) {
  return MetricValue(metrics, "tandem_slo_attainment_total{met=\"" +
                                  std::string(met ? "true" : "false") + "\",slo=\"" + slo + "\"}")
      .value_or(-1);
}

TEST(SloPolicyE2eTest, BudgetsAreCountedSlackIsReportedAndTheModelIsExported) {
  Daemon daemon;
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  EXPECT_THAT(daemon.Log(), HasSubstr("policy slo: budgets TTFT 1s and TPOT 100ms"));
  auto stub = daemon.Stub();

  // A long stream with an ample budget, read in the background.
  grpc::ClientContext stream_context;
  stream_context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
  v1::GenerateRequest long_stream = Tokens(20, 1, 2000);
  long_stream.mutable_latency_budget()->set_ttft_ms(600000);
  long_stream.mutable_latency_budget()->set_tpot_ms(60000);
  auto reader = stub->Generate(&stream_context, long_stream);
  std::atomic<bool> stop_reading{false};
  std::thread stream_reader([&] {
    v1::GenerateResponse message;
    while (!stop_reading.load() && reader->Read(&message)) {
    }
  });
  // While it decodes, GetLoad says how much later its next token may come.
  v1::Load seen;
  EXPECT_TRUE(daemon.WaitForLoad([&](const v1::Load& l) {
    seen = l;
    return l.has_slo_slack_ms();
  })) << daemon.Log();
  EXPECT_GT(seen.slo_slack_ms(), 0);  // a minute per token: far from due

  // Met: an ample budget. Missed: a TPOT no machine keeps (1 us).
  v1::GenerateRequest met = Tokens(30, 2, 8);
  met.mutable_latency_budget()->set_ttft_ms(600000);
  met.mutable_latency_budget()->set_tpot_ms(600000);
  v1::GenerateRequest missed = Tokens(30, 3, 8);
  missed.mutable_latency_budget()->set_tpot_ms(0.001);
  const Generation a = Generate(*stub, met);
  const Generation b = Generate(*stub, missed);
  const Generation plain = Generate(*stub, Tokens(30, 2, 8));
  stop_reading.store(true);
  stream_context.TryCancel();
  stream_reader.join();
  reader->Finish();
  ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.token_ids, plain.token_ids);  // budgets change no token

  // The third ran on the daemon's budget (1 s TTFT, 100 ms TPOT), whose
  // outcome is this machine's timing: counted, not asserted either way.
  const auto metrics = HttpGet(daemon.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_GE(Attainment(*metrics, "tpot", true), 1) << *metrics;
  EXPECT_GE(Attainment(*metrics, "tpot", false), 1) << *metrics;
  EXPECT_EQ(Attainment(*metrics, "tpot", true) + Attainment(*metrics, "tpot", false), 3);
  EXPECT_GE(Attainment(*metrics, "ttft", true), 1);
  // The cancelled stream is not counted: it did not end by itself.
  EXPECT_EQ(Attainment(*metrics, "ttft", true) + Attainment(*metrics, "ttft", false), 3);
  // The step-time model: predictions and compute summed, its error, its terms.
  EXPECT_GT(
      MetricValue(*metrics, "tandem_step_predicted_seconds_total{worker=\"prefill\"}").value_or(0),
      0);
  EXPECT_GT(
      MetricValue(*metrics, "tandem_step_compute_seconds_total{worker=\"prefill\"}").value_or(0),
      0);
  EXPECT_TRUE(MetricValue(*metrics, "tandem_step_time_model_error_ratio").has_value());
  // Every term is exported. The fit may move any one of them to 0 (under a
  // sanitizer the fixed cost vanishes beside the per-token one), but a
  // one-token step never costs nothing.
  double one_token_step = 0;
  for (const char* term : {"fixed", "per_token", "per_kilo_read", "per_kilo_shared_read"}) {
    const auto value = MetricValue(
        *metrics, absl::StrCat("tandem_step_time_model_coefficient{term=\"", term, "\"}"));
    ASSERT_TRUE(value.has_value()) << term << "\n" << *metrics;
    if (std::string_view(term) == "fixed" || std::string_view(term) == "per_token") {
      one_token_step += *value;
    }
  }
  EXPECT_GT(one_token_step, 0);
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(SloPolicyE2eTest, SloAdmissionRefusesAPredictedMissBeforeAnyCompute) {
  // A 1 ms TTFT budget: no prompt of 200 tokens is computed that fast here.
  Daemon daemon({"--admission=slo", "--slo_ttft=1ms"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();
  const Generation refused = Generate(*stub, Tokens(200, 4, 4));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("predicted time to first token"));
  EXPECT_TRUE(refused.token_ids.empty());
  // Its own budget allows it: taken.
  v1::GenerateRequest patient = Tokens(200, 4, 4);
  patient.mutable_latency_budget()->set_ttft_ms(600000);
  const Generation taken = Generate(*stub, patient);
  EXPECT_TRUE(taken.status.ok()) << taken.status.error_message();
  EXPECT_EQ(taken.token_ids.size(), 4u);
  const auto metrics = HttpGet(daemon.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(FinishedRequests(*metrics), 1);  // the refused one never ran
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(SloPolicyE2eTest, BadPolicyFlagsStopTheDaemonNamingTheFlag) {
  ExpectStartupErrors({
      {{"--policy=fastest"}, 2, "--policy='fastest': expected slo or threshold"},
      {{"--policy=slo", "--disagg_output_threshold=8"},
       2,
       "--disagg_output_threshold=8 goes with --policy=threshold"},
      {{"--slo_tpot=0s"}, 2, "--slo_tpot=0: must be in (0, 1h]"},
      {{"--admission=always"}, 2, "--admission='always': expected none or slo"},
      {{"--decode_step_interval=20ms"}, 2, "go with --policy=threshold"},
  });
}

}  // namespace
}  // namespace tandem::testing
