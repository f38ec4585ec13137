// `tandem bench` against a real tandemd at tiny scale: every built-in
// scenario, a scenario file, a trace, and the errors a user gets for bad
// flags. Checks what the report must say exactly (request and token counts,
// no failures, the path every request took, prefix-cache hits where prompts
// share a prefix), not how fast it was.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <sstream>

#include "google/protobuf/util/json_util.h"
#include "tandem/bench/v1/bench.pb.h"
#include "tests/e2e/daemon.h"
#include "tests/test_paths.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

struct BenchRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
  bench::v1::BenchReport report;
};

// Runs `tandem bench FLAGS --json=...` and reads its report.
BenchRun RunBench(const std::string& flags) {
  static int runs = 0;
  const std::string base =
      ::testing::TempDir() + "/bench_" + std::to_string(::getpid()) + "_" + std::to_string(runs++);
  const std::string command = PathFromEnv("TANDEM_CLI", paths::kCli) + " bench " + flags +
                              " --json=" + base + ".json > " + base + ".out 2>&1";
  BenchRun run;
  const int status = std::system(command.c_str());
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream out(base + ".out");
  std::stringstream text;
  text << out.rdbuf();
  run.output = text.str();
  std::ifstream json(base + ".json");
  std::stringstream json_text;
  json_text << json.rdbuf();
  if (!json_text.str().empty()) {
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json_text.str(), &run.report).ok());
  }
  return run;
}

std::string ServerFlags(const Daemon& daemon) {
  return "--server=" + daemon.address() +
         " --metrics=http://127.0.0.1:" + std::to_string(daemon.metrics_port()) + "/metrics";
}

TEST(BenchCommand, EveryBuiltinScenarioRunsAtTinyScale) {
  Daemon daemon;
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  for (const char* scenario :
       {"chat", "long-context", "coding-agent", "long-running", "crossover"}) {
    SCOPED_TRACE(scenario);
    // 3 requests of exactly 4 output tokens, 1 client (coding-agent: one
    // session of 3 turns, each turn's prompt extending the last).
    const BenchRun run = RunBench(ServerFlags(daemon) + " --scenario=" + scenario +
                                  " --requests=3 --concurrency=1 --output_tokens=4 --duration=300");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    ASSERT_EQ(run.report.runs_size(), 1) << run.output;
    const bench::v1::RunReport& r = run.report.runs(0);
    EXPECT_EQ(r.scenario(), scenario);
    EXPECT_EQ(r.target(), "tandem");
    EXPECT_EQ(r.concurrency(), 1);
    EXPECT_EQ(r.total().requests(), 3);
    EXPECT_EQ(r.total().failures(), 0) << run.output;
    EXPECT_EQ(r.total().output_tokens(), 12);
    EXPECT_EQ(r.total().ttft_samples_ms_size(), 3);
    EXPECT_EQ(r.total().colocated() + r.total().disaggregated(), 3);
    EXPECT_GT(r.total().ttft_ms().p50(), 0);
    EXPECT_LE(r.total().good(), 3);
    // The server's own view of the same run, scraped before and after.
    double ttft_count = 0;
    for (const bench::v1::ServerHistogram& h : r.server()) {
      if (h.name() == "tandem_time_to_first_token_seconds") ttft_count += h.count();
    }
    EXPECT_GE(ttft_count, 3);
    if (std::string(scenario) == "coding-agent") {
      // Turns 2 and 3 find the earlier turns' prompt and answer in the cache.
      EXPECT_GT(r.prefix_hit_ratio(), 0.5);
    }
    EXPECT_THAT(run.output, HasSubstr("| " + std::string(scenario) + " | tandem |"));
  }
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(BenchCommand, CodingAgentEditSessionsAreChatsThatSpeculateOnTheirFile) {
  // The daemon's defaults (suffix drafting). One session of 3 turns, each
  // asking for a repository file of 500-2,000 tokens back with a change,
  // answers cut at 48 tokens.
  Daemon daemon;
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  const BenchRun run = RunBench(ServerFlags(daemon) +
                                " --scenario=coding-agent-edit --requests=3 --output_tokens=48 "
                                "--duration=300");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_EQ(run.report.runs_size(), 1) << run.output;
  const bench::v1::ClassReport& t = run.report.runs(0).total();
  EXPECT_EQ(t.requests(), 3);
  EXPECT_EQ(t.failures(), 0) << run.output;
  // The first prompt holds a whole file of at least 500 tokens in the chat;
  // the later ones the code of the answer before.
  EXPECT_GT(t.prompt_tokens(), 500);
  EXPECT_GT(t.output_tokens(), 0);
  EXPECT_LE(t.output_tokens(), 3 * 48);
  // An answer that copies the file is drafted from it, and the daemon's
  // counts reach the report.
  EXPECT_GT(t.drafted_tokens(), 0) << run.output;
  EXPECT_GT(t.accepted_tokens(), 0) << run.output;
  EXPECT_LE(t.accepted_tokens(), t.drafted_tokens());
  EXPECT_GT(t.tokens_per_step(), 1.0);
  // Each answer is checked against its repository file, line by line.
  EXPECT_GT(t.edit_file_lines(), 3 * 10);
  EXPECT_LE(t.edit_lines_kept(), t.edit_file_lines());
  EXPECT_THAT(run.output, HasSubstr("| coding-agent-edit | tandem |"));
  EXPECT_THAT(run.output, HasSubstr("## Speculative decoding"));
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(BenchCommand, ReplaysATraceAndRunsAScenarioFile) {
  Daemon daemon;
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  const std::string dir = ::testing::TempDir();
  {
    std::ofstream trace(dir + "/trace.jsonl");
    trace << "{\"arrival_s\": 0.0, \"input_tokens\": 40, \"output_tokens\": 3}\n"
             "{\"arrival_s\": 0.1, \"prompt\": \"Summarise the plot of Hamlet.\", "
             "\"output_tokens\": 5}\n";
    std::ofstream scenario(dir + "/scenario.json");
    scenario << R"({"name": "mine", "classes": [{"name": "q", "input_tokens": {"median": 48},
      "output_tokens": {"median": 6}, "shared_prefix_ratio": 0.5, "concurrency": 2,
      "slo_ttft_ms": 60000, "slo_itl_ms": 60000}]})";
  }
  const BenchRun traced =
      RunBench(ServerFlags(daemon) + " --trace=" + dir + "/trace.jsonl --duration=300");
  ASSERT_EQ(traced.exit_code, 0) << traced.output;
  ASSERT_EQ(traced.report.runs_size(), 1);
  EXPECT_EQ(traced.report.runs(0).total().requests(), 2);
  EXPECT_EQ(traced.report.runs(0).total().output_tokens(), 8);
  EXPECT_EQ(traced.report.runs(0).total().failures(), 0) << traced.output;

  const BenchRun custom =
      RunBench(ServerFlags(daemon) + " --scenario=" + dir + "/scenario.json --requests=4");
  ASSERT_EQ(custom.exit_code, 0) << custom.output;
  const bench::v1::RunReport& r = custom.report.runs(0);
  EXPECT_EQ(r.scenario(), "mine");
  EXPECT_EQ(r.total().requests(), 4);
  EXPECT_EQ(r.total().output_tokens(), 24);
  // SLOs this loose are met by every request.
  EXPECT_EQ(r.total().good(), 4);
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(BenchCommand, BadFlagsAreClearErrors) {
  struct Case {
    std::string flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"--scenario=nope", "neither a built-in scenario"},
      {"--scenario=chat --rate=0", "--rate: '0' is not a positive number"},
      {"--scenario=chat --rate=1 --concurrency=2", "give --concurrency or --rate, not both"},
      {"--requests=0 --duration=0", "give --requests or --duration"},
      {"--peer=vllm", "unknown peer 'vllm'"},
      {"--slo_itl_ms=-5", "--slo_ttft_ms and --slo_itl_ms must be >= 0"},
      {"--trace=/no/such/file", "--trace=/no/such/file: cannot read"},
      {"--sweep-threshold", "give --model=FILE"},
      {"--configs=onlyone:--threads=1", "at least two NAME:FLAGS"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    const BenchRun run = RunBench("--server=127.0.0.1:1 " + c.flags);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_THAT(run.output, HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace tandem::testing
