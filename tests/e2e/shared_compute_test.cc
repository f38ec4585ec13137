// The prefill and decode workers on one shared compute pool, end to end: a
// decode stream preempts a long prompt's prefill (both metrics show it) and
// neither answer changes; --disagg_output_threshold=auto is measured,
// exported and reported; bad compute and sampling flags stop the daemon with
// the flag named; server-side sampling defaults apply to requests that set
// none.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "tests/e2e/daemon.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

TEST(SharedComputeE2eTest, ALongPromptYieldsToADecodeStreamAndNeitherAnswerChanges) {
  // Every CPU: the subject is the pool's helpers moving between the lanes.
  Daemon daemon({"--disagg_output_threshold=0", "--threads=0"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();

  // A long stream, moved to the decode worker after its first token; read
  // until the long prompt below is answered, then cancelled.
  grpc::ClientContext stream_context;
  stream_context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
  auto reader = stub->Generate(&stream_context, Tokens(20, 1, 1500));
  std::vector<uint32_t> streamed;
  std::atomic<bool> stop_reading{false};
  std::thread stream_reader([&] {
    v1::GenerateResponse message;
    while (!stop_reading.load() && reader->Read(&message)) {
      streamed.insert(streamed.end(), message.token_ids().begin(), message.token_ids().end());
    }
  });
  ASSERT_TRUE(daemon.WaitForLoad([](const v1::Load& l) { return l.running_decode() == 1; }));

  // 1,200 prompt tokens are ten prefill steps; the stream's steps come
  // every --decode_step_interval while they run.
  const Generation prompt = Generate(*stub, Tokens(1200, 2, 2));
  ASSERT_TRUE(prompt.status.ok()) << prompt.status.error_message();
  stop_reading.store(true);
  stream_context.TryCancel();
  stream_reader.join();
  reader->Finish();

  const auto metrics = HttpGet(daemon.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_GT(MetricValue(*metrics, "tandem_prefill_yielded_seconds_total").value_or(0), 0)
      << *metrics;
  EXPECT_GT(MetricValue(*metrics, "tandem_decode_start_delay_seconds_count").value_or(0), 0);

  // Alone, each gives the same tokens (the stream: as many as it had).
  ASSERT_GT(streamed.size(), 10u);
  const Generation prompt_alone = Generate(*stub, Tokens(1200, 2, 2));
  EXPECT_EQ(prompt_alone.token_ids, prompt.token_ids);
  const Generation stream_alone = Generate(*stub, Tokens(20, 1, static_cast<int>(streamed.size())));
  EXPECT_EQ(stream_alone.token_ids, streamed);
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(SharedComputeE2eTest, TheAutoThresholdIsMeasuredExportedAndReported) {
  // Five timed rounds (the daemon's default): this compares two timings.
  Daemon daemon({"--disagg_output_threshold=auto", "--startup_measure_rounds=5"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();
  grpc::ClientContext context;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_TRUE(info.disagg_output_threshold_auto());
  const auto metrics = HttpGet(daemon.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(MetricValue(*metrics, "tandem_disagg_output_threshold"),
            static_cast<double>(info.disagg_output_threshold()));
  const double decode_pass =
      MetricValue(*metrics, "tandem_disagg_auto_cost_seconds{measure=\"decode_pass\"}").value_or(0);
  const double chunk =
      MetricValue(*metrics, "tandem_disagg_auto_cost_seconds{measure=\"chunk_step\"}").value_or(0);
  EXPECT_GT(decode_pass, 0);
  EXPECT_GT(chunk, decode_pass) << "a 128-token chunk step costs more than a decode step";
  EXPECT_THAT(daemon.Log(), HasSubstr("disaggregation threshold auto: decode pass"));
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(SharedComputeE2eTest, SamplingDefaultsApplyToRequestsThatSetNone) {
  // Greedy by default: two unseeded requests that set no sampling agree
  // with an explicitly greedy one.
  Daemon daemon({"--default_temperature=0"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();
  v1::GenerateRequest unset = Chat("Name three colours.", std::nullopt, 16);
  const Generation a = Generate(*stub, unset);
  const Generation b = Generate(*stub, unset);
  const Generation greedy = Generate(*stub, Chat("Name three colours.", 0.0f, 16));
  ASSERT_TRUE(a.status.ok() && b.status.ok() && greedy.status.ok());
  EXPECT_EQ(a.token_ids, greedy.token_ids);
  EXPECT_EQ(b.token_ids, greedy.token_ids);
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(SharedComputeE2eTest, BadComputeAndSamplingFlagsStopTheDaemonNamingTheFlag) {
  ExpectStartupErrors({
      {{"--threads=-1"}, 2, "--threads=-1: must be >= 0"},
      {{"--threads=2", "--decode_reserved_threads=2"}, 1, "--decode_reserved_threads=2: must be 0"},
      {{"--decode_step_interval=-1ms"}, 2, "--decode_step_interval=-1ms: must be >= 0"},
      {{"--prefill_min_share=1"}, 2, "--prefill_min_share=1: must be in [0, 1)"},
      {{"--disagg_output_threshold=sometimes"},
       2,
       "--disagg_output_threshold='sometimes': expected a token count >= 0, 'auto' or 'off'"},
      {{"--default_top_p=0"}, 2, "--default_top_p=0: must be in (0, 1]"},
      {{"--default_temperature=-1"}, 2, "--default_temperature=-1: must be a finite number >= 0"},
      {{"--default_top_k=-2"}, 2, "--default_top_k=-2: must be >= 0"},
  });
}

}  // namespace
}  // namespace tandem::testing
