// Scheduling end to end with the real model: the path a request takes
// (colocated, disaggregated from the start, handed over mid-decode), the
// chunk size and preemption never change its greedy tokens; and a soak of 200
// mixed requests with cancellations and deadlines leaves every block free and
// the daemon healthy.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <future>
#include <map>
#include <random>

#include "tests/e2e/daemon.h"

namespace tandem::testing {
namespace {

struct Answer {
  std::vector<uint32_t> tokens;
  v1::Path path = v1::PATH_UNSPECIFIED;
  v1::PathReason reason = v1::PATH_REASON_UNSPECIFIED;
};

// Four greedy requests at once; answers in request order.
std::vector<Answer> RunFour(Daemon& daemon) {
  std::vector<std::future<Generation>> futures;
  for (int i = 0; i < 4; ++i) {
    futures.push_back(std::async(std::launch::async, [&daemon, i] {
      auto stub = daemon.Stub();
      return Generate(*stub, Tokens(40 + 17 * i, i, 24));
    }));
  }
  std::vector<Answer> out;
  for (auto& f : futures) {
    Generation g = f.get();
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
    out.push_back({g.token_ids, g.last.path(), g.last.path_reason()});
  }
  return out;
}

TEST(SchedulingTest, PathsChunkingAndPreemptionNeverChangeGreedyTokens) {
  struct Config {
    std::string name;
    std::vector<std::string> flags;
    v1::Path path;
    v1::PathReason reason;
  };
  const std::vector<Config> configs = {
      // Every CPU (--threads=0) where the test does not name a count: the
      // tokens must not depend on the pool's size (the harness would
      // otherwise give each daemon one thread under ctest: TestComputeThreads).
      {"one worker",
       {"--disagg_output_threshold=off", "--threads=0"},
       v1::PATH_COLOCATED,
       v1::PATH_REASON_DISAGGREGATION_OFF},
      {"disaggregated on a reserved decode core",
       {"--disagg_output_threshold=0", "--decode_reserved_threads=1"},
       v1::PATH_DISAGGREGATED,
       v1::PATH_REASON_THRESHOLD_REACHED},
      {"one thread for both lanes",
       {"--disagg_output_threshold=0", "--threads=1"},
       v1::PATH_DISAGGREGATED,
       v1::PATH_REASON_THRESHOLD_REACHED},
      {"disaggregated from the start",
       {"--disagg_output_threshold=0", "--threads=0"},
       v1::PATH_DISAGGREGATED,
       v1::PATH_REASON_THRESHOLD_REACHED},
      {"handed over mid-decode",
       {"--disagg_output_threshold=6"},
       v1::PATH_DISAGGREGATED,
       v1::PATH_REASON_THRESHOLD_REACHED},
      {"max_tokens below the threshold",
       {"--disagg_output_threshold=32"},
       v1::PATH_COLOCATED,
       v1::PATH_REASON_BELOW_THRESHOLD},
      {"chunks of 7",
       {"--max_batched_tokens=7", "--disagg_output_threshold=10"},
       v1::PATH_DISAGGREGATED,
       v1::PATH_REASON_THRESHOLD_REACHED},
      {"chunks of 33",
       {"--max_batched_tokens=33", "--disagg_output_threshold=32"},
       v1::PATH_COLOCATED,
       v1::PATH_REASON_BELOW_THRESHOLD},
      // The default policy with a budget colocated steps keep on any machine
      // however loaded (10 s a token): nobody moves. (At the default 100 ms a
      // busy CI machine's step times can make the forecast move a stream.)
      {"the SLO policy, chunks of 40",
       {"--max_batched_tokens=40", "--slo_tpot=10s"},
       v1::PATH_COLOCATED,
       v1::PATH_REASON_SLO_HEADROOM},
      // A TPOT budget only steps of their own could keep: on a machine where
      // a decode-lane step keeps it the streams move, elsewhere they stay;
      // either way the tokens are the same.
      {"the SLO policy, a tight TPOT",
       {"--slo_tpot=25ms", "--max_batched_tokens=64"},
       v1::PATH_UNSPECIFIED,
       v1::PATH_REASON_SLO_HEADROOM},
      // 9 blocks of 16 for 4 sequences of up to 115 tokens: preemption.
      {"preempted and resumed",
       {"--context_length=128", "--kv_cache_bytes=3317760", "--disagg_output_threshold=8"},
       v1::PATH_DISAGGREGATED,
       v1::PATH_REASON_THRESHOLD_REACHED},
  };
  std::vector<Answer> reference;
  for (const Config& config : configs) {
    Daemon daemon(config.flags);
    ASSERT_TRUE(daemon.WaitServing()) << config.name << ": " << daemon.Log();
    const std::vector<Answer> answers = RunFour(daemon);
    if (reference.empty()) reference = answers;
    for (size_t i = 0; i < answers.size(); ++i) {
      EXPECT_EQ(answers[i].tokens, reference[i].tokens) << config.name << ", request " << i;
      if (config.path != v1::PATH_UNSPECIFIED) {
        EXPECT_EQ(answers[i].path, config.path) << config.name << ", request " << i;
      }
      EXPECT_EQ(answers[i].reason, config.reason) << config.name << ", request " << i;
    }
    if (config.name == "preempted and resumed") {
      const auto metrics = HttpGet(daemon.metrics_port(), "/metrics");
      ASSERT_TRUE(metrics.has_value());
      EXPECT_GT(MetricValue(*metrics, "tandem_preemptions_total").value_or(0), 0) << *metrics;
    }
    EXPECT_EQ(daemon.Stop(SIGTERM), 0) << config.name;
  }
}

TEST(SchedulingTest, TheHintAndTheWorkloadTagMoveLongRequestsRightAfterPrefill) {
  Daemon daemon({"--disagg_output_threshold=20"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();
  v1::GenerateRequest r = Chat("Count from one to fifty.", 0.0f, 30);
  r.set_ignore_eos(true);
  r.set_expected_output_tokens(30);
  Generation hinted = Generate(*stub, r);
  ASSERT_TRUE(hinted.status.ok());
  EXPECT_EQ(hinted.last.path(), v1::PATH_DISAGGREGATED);
  EXPECT_EQ(hinted.last.path_reason(), v1::PATH_REASON_EXPECTED_OUTPUT_HINT);
  EXPECT_GE(hinted.last.timeline().handoff_ms(), 0.0);
  // Teach the workload "essay" that it writes 30 tokens.
  r.set_expected_output_tokens(0);
  r.set_workload("essay");
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(Generate(*stub, r).status.ok());
  Generation learned = Generate(*stub, r);
  EXPECT_EQ(learned.last.path_reason(), v1::PATH_REASON_WORKLOAD_ESTIMATE);
  EXPECT_EQ(learned.token_ids, hinted.token_ids);
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

// 200 requests of mixed lengths from 8 clients; some cancel mid-stream, some
// have deadlines too short to finish. Every request ends exactly one way,
// every KV block comes back, and the daemon keeps serving.
TEST(SchedulingTest, SoakOfTwoHundredMixedRequestsLeaksNothing) {
  // 160 blocks: enough for the load, small enough to preempt now and then.
  Daemon daemon({"--kv_cache_bytes=58982400", "--context_length=512", "--max_queued_requests=256"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  constexpr int kRequests = 200, kClients = 8;
  std::map<std::string, int> outcomes;
  std::mutex mu;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(1000 + static_cast<unsigned>(c));
      auto stub = daemon.Stub();
      for (int i = c; i < kRequests; i += kClients) {
        v1::GenerateRequest r;
        const int prompt = 5 + static_cast<int>(rng() % 120);
        for (int t = 0; t < prompt; ++t)
          r.add_token_ids(static_cast<uint32_t>(300 + rng() % 30000));
        r.set_max_tokens(1 + static_cast<int>(rng() % 48));
        r.mutable_sampling()->set_temperature(rng() % 2 ? 0.0f : 0.8f);
        r.set_ignore_eos(rng() % 2 == 0);
        const int kind = static_cast<int>(rng() % 10);
        std::string outcome;
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() +
                             (kind == 0 ? std::chrono::milliseconds(30) : std::chrono::minutes(5)));
        auto reader = stub->Generate(&context, r);
        v1::GenerateResponse response;
        int messages = 0;
        bool finished = false;
        while (reader->Read(&response)) {
          ++messages;
          finished |= response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
          if (kind == 1 && messages == 2) context.TryCancel();  // the client goes away
        }
        const grpc::Status status = reader->Finish();
        if (status.ok()) {
          outcome = finished ? "completed" : "ok without a final message";
        } else if (status.error_code() == grpc::StatusCode::CANCELLED) {
          outcome = "cancelled";
        } else if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
          outcome = "deadline";
        } else {
          outcome = "error " + std::to_string(status.error_code()) + " " + status.error_message();
        }
        std::lock_guard<std::mutex> lock(mu);
        ++outcomes[outcome];
      }
    });
  }
  for (auto& t : clients) t.join();
  int total = 0;
  for (const auto& [outcome, count] : outcomes) {
    total += count;
    EXPECT_TRUE(outcome == "completed" || outcome == "cancelled" || outcome == "deadline")
        << count << " x " << outcome;
  }
  EXPECT_EQ(total, kRequests);
  EXPECT_GT(outcomes["completed"], 150);
  EXPECT_GT(outcomes["cancelled"] + outcomes["deadline"], 10);

  // The server saw each request end once, and holds nothing now.
  // Cancellations and deadlines land at the next step boundary, after the
  // client has seen its status: a request that never got blocks may still
  // be on its way to the finished counter, so wait for both.
  std::optional<std::string> metrics;
  for (int i = 0; i < 50; ++i) {
    metrics = HttpGet(daemon.metrics_port(), "/metrics");
    if (metrics && MetricValue(*metrics, "tandem_kv_cache_used_blocks") == 0.0 &&
        FinishedRequests(*metrics) == kRequests) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(MetricValue(*metrics, "tandem_kv_cache_used_blocks"), 0.0) << *metrics;
  EXPECT_EQ(MetricValue(*metrics, "tandem_waiting_requests"), 0.0);
  const double finished = FinishedRequests(*metrics);
  EXPECT_EQ(finished, kRequests);
  EXPECT_EQ(daemon.Health(), "SERVING");
  auto stub = daemon.Stub();
  EXPECT_TRUE(Generate(*stub, Chat("Say yes.", 0.0f, 4)).status.ok());
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace tandem::testing
