// tandemd end to end, over real gRPC: a chat answer, concurrency without
// interference, every validation error, stops, cancellation, deadlines,
// health, metrics and shutdown.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <limits>
#include <thread>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/e2e/daemon.h"
#include "tests/test_paths.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

// A daemon for the tests that only send requests. ctest runs each test in a
// process of its own (gtest_discover_tests), so each test starts one (about
// a second); run the binary directly and the suite shares one. Tests here
// must therefore not depend on what another test left in the daemon.
class TandemdTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new Daemon({"--max_queued_requests=64"});
    ASSERT_TRUE(daemon_->WaitServing()) << daemon_->Log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(daemon_->Stop(SIGTERM), 0) << daemon_->Log();
    delete daemon_;
  }
  static Daemon* daemon_;
};
Daemon* TandemdTest::daemon_ = nullptr;

TEST_F(TandemdTest, AnswersTheCapitalOfFranceWithParis) {
  auto stub = daemon_->Stub();
  v1::GenerateRequest request = Chat("What is the capital of France?", 0.0f, 64);
  request.set_request_id("e2e-paris");
  Generation g = Generate(*stub, request);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_THAT(g.text, HasSubstr("Paris"));
  EXPECT_GT(g.messages.size(), 2u) << "the answer should stream in several messages";
  for (const auto& m : g.messages) EXPECT_EQ(m.request_id(), "e2e-paris");
  EXPECT_EQ(g.last.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(g.last.usage().completion_tokens(), static_cast<int>(g.token_ids.size()));
  EXPECT_GT(g.last.usage().prompt_tokens(), 10);
  const v1::Timeline& t = g.last.timeline();
  EXPECT_GT(t.total_ms(), 0.0);
  EXPECT_NEAR(t.queued_ms() + t.prefill_ms() + t.decode_ms(), t.total_ms(), 0.01);
  EXPECT_NEAR(t.first_token_ms(), t.queued_ms() + t.prefill_ms(), 0.01);
}

TEST_F(TandemdTest, EightConcurrentRequestsGetExactlyTheirSoloTokens) {
  auto stub = daemon_->Stub();
  std::vector<v1::GenerateRequest> requests;
  const char* questions[] = {"Name a fruit.",       "What is 2+2?",        "Say hello in Spanish.",
                             "Describe the sky.",   "What is a computer?", "Name a color.",
                             "Write a short poem.", "Why is water wet?"};
  for (int i = 0; i < 8; ++i) {
    // Half greedy, half seeded sampling; lengths differ so batches churn.
    v1::GenerateRequest r = Chat(questions[i], i % 2 == 0 ? 0.0f : 0.9f, 24 + 4 * i);
    r.mutable_sampling()->set_seed(1000 + static_cast<uint64_t>(i));
    requests.push_back(r);
  }
  std::vector<std::vector<uint32_t>> alone;
  for (const auto& r : requests) {
    Generation g = Generate(*stub, r);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    alone.push_back(g.token_ids);
  }
  std::vector<std::future<Generation>> together;
  for (const auto& r : requests) {
    together.push_back(std::async(std::launch::async, [&r] {
      auto own_stub = daemon_->Stub();
      return Generate(*own_stub, r);
    }));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    Generation g = together[i].get();
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.token_ids, alone[i]) << "request " << i << " changed when run concurrently";
  }
}

TEST_F(TandemdTest, InvalidRequestsAreRejectedWithTheFieldNamed) {
  auto stub = daemon_->Stub();
  struct Case {
    std::string what;
    v1::GenerateRequest request;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({"empty input", v1::GenerateRequest(), "prompt"});
  {
    v1::GenerateRequest r = Chat("hi", 0.0f, 5);
    r.set_prompt("also a prompt");
    cases.push_back({"two inputs", r, "exactly one of"});
  }
  {
    v1::GenerateRequest r = Chat("hi", 0.0f, 5);
    r.set_max_tokens(-3);
    cases.push_back({"negative max_tokens", r, "max_tokens"});
  }
  cases.push_back({"max_tokens beyond the context", Chat("hi", 0.0f, 100000), "max_tokens"});
  cases.push_back({"NaN temperature", Chat("hi", std::nanf(""), 5), "sampling.temperature"});
  cases.push_back({"negative temperature", Chat("hi", -1.0f, 5), "sampling.temperature"});
  {
    v1::GenerateRequest r = Chat("hi", 0.0f, 5);
    r.mutable_sampling()->set_top_p(1.5f);
    cases.push_back({"top_p above 1", r, "sampling.top_p"});
  }
  {
    v1::GenerateRequest r = Chat("hi", 0.0f, 5);
    r.mutable_messages(0)->set_role("wizard");
    cases.push_back({"unknown role", r, "messages[0].role"});
  }
  {
    v1::GenerateRequest r;
    r.add_token_ids(5);
    r.add_token_ids(49152);
    cases.push_back({"token id outside the vocabulary", r, "token_ids[1]"});
  }
  {
    v1::GenerateRequest r;
    for (int i = 0; i < 9000; ++i) r.add_token_ids(100);
    cases.push_back({"prompt longer than the context", r, "token_ids"});
  }
  {
    v1::GenerateRequest r = Chat("hi", 0.0f, 5);
    for (int i = 0; i < 17; ++i) r.add_stop(std::to_string(i * 7919));
    cases.push_back({"too many stop strings", r, "stop"});
  }
  {
    v1::GenerateRequest r = Chat("hi", 0.0f, 5);
    r.add_stop("");
    cases.push_back({"empty stop string", r, "stop[0]"});
  }
  {
    v1::GenerateRequest r = Chat("hi", 0.0f, 5);
    r.add_stop_token_ids(70000);
    cases.push_back({"stop token outside the vocabulary", r, "stop_token_ids[0]"});
  }
  {
    v1::GenerateRequest r = Chat("hi", 0.0f, 5);
    r.mutable_latency_budget()->set_tpot_ms(-5);
    cases.push_back({"negative TPOT budget", r, "latency_budget.tpot_ms"});
  }
  {
    v1::GenerateRequest r = Chat("hi", 0.0f, 5);
    r.mutable_latency_budget()->set_ttft_ms(std::nan(""));
    cases.push_back({"NaN TTFT budget", r, "latency_budget.ttft_ms"});
  }
  {
    v1::GenerateRequest r = Chat("hi", 0.0f, 5);
    r.mutable_latency_budget()->set_ttft_ms(1e12);
    cases.push_back({"TTFT budget beyond an hour", r, "latency_budget.ttft_ms"});
  }
  {
    v1::GenerateRequest r = Chat("hi", 0.0f, 5);
    r.mutable_latency_budget()->set_tpot_ms(std::numeric_limits<double>::infinity());
    cases.push_back({"infinite TPOT budget", r, "latency_budget.tpot_ms"});
  }
  for (const Case& c : cases) {
    Generation g = Generate(*stub, c.request);
    EXPECT_EQ(g.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.what;
    EXPECT_THAT(g.status.error_message(), HasSubstr(c.field)) << c.what;
    EXPECT_TRUE(g.messages.empty()) << c.what;
  }
  // Bad requests do not disturb the daemon.
  Generation ok = Generate(*stub, Chat("Say yes.", 0.0f, 4));
  EXPECT_TRUE(ok.status.ok());
  EXPECT_EQ(daemon_->Health(), "SERVING");
}

TEST_F(TandemdTest, StopStringsEndTheAnswerBeforeTheStopString) {
  auto stub = daemon_->Stub();
  v1::GenerateRequest request = Chat("What is the capital of France?", 0.0f, 64);
  Generation full = Generate(*stub, request);
  ASSERT_THAT(full.text, HasSubstr(" is Paris"));
  request.add_stop(" is Paris");
  Generation cut = Generate(*stub, request);
  ASSERT_TRUE(cut.status.ok());
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(" is Paris")));
  EXPECT_EQ(cut.last.finish_reason(), v1::FINISH_REASON_STOP);
}

TEST_F(TandemdTest, MaxTokensEndsWithLengthAndTokenIdsWork) {
  auto stub = daemon_->Stub();
  v1::GenerateRequest request;
  for (uint32_t id : {504u, 3575u, 282u, 4649u})
    request.add_token_ids(id);  // "The capital of France"
  request.set_max_tokens(7);
  request.mutable_sampling()->set_temperature(0.0f);
  request.set_ignore_eos(true);
  Generation g = Generate(*stub, request);
  ASSERT_TRUE(g.status.ok());
  EXPECT_EQ(g.token_ids.size(), 7u);
  EXPECT_EQ(g.last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(g.last.usage().prompt_tokens(), 4);
}

TEST_F(TandemdTest, SeededSamplingRepeatsAndGreedyIsTheDefaultForTemperatureZero) {
  auto stub = daemon_->Stub();
  v1::GenerateRequest r = Chat("Tell me a story.", 1.0f, 20);
  r.mutable_sampling()->set_seed(77);
  Generation a = Generate(*stub, r), b = Generate(*stub, r);
  EXPECT_EQ(a.token_ids, b.token_ids);
  r.mutable_sampling()->set_seed(78);
  Generation c = Generate(*stub, r);
  EXPECT_NE(a.token_ids, c.token_ids);
}

TEST_F(TandemdTest, ClientCancellationMidStreamLeavesTheDaemonHealthy) {
  auto stub = daemon_->Stub();
  v1::GenerateRequest request = Chat("Write a very long essay about the ocean.", 0.0f, 2000);
  request.set_ignore_eos(true);
  grpc::ClientContext context;
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  int received = 0;
  while (received < 3 && reader->Read(&response)) ++received;
  EXPECT_EQ(received, 3);
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  Generation after = Generate(*stub, Chat("Say yes.", 0.0f, 4));
  EXPECT_TRUE(after.status.ok());
}

TEST_F(TandemdTest, DeadlinesAreHonouredMidStream) {
  auto stub = daemon_->Stub();
  v1::GenerateRequest request = Chat("Write a very long essay about mountains.", 0.0f, 4000);
  request.set_ignore_eos(true);
  const auto start = std::chrono::steady_clock::now();
  Generation g = Generate(*stub, request, std::chrono::milliseconds(500));
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(Generate(*stub, Chat("Say yes.", 0.0f, 4)).status.ok());
}

TEST_F(TandemdTest, MetricsAreServedAndPassPromtool) {
  auto stub = daemon_->Stub();
  ASSERT_TRUE(Generate(*stub, Chat("Say yes.", 0.0f, 4)).status.ok());
  std::optional<std::string> metrics = HttpGet(daemon_->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(
      MetricValue(*metrics, "tandem_requests_total{finish_reason=\"length\",path=\"colocated\"}"),
      1.0);
  EXPECT_THAT(*metrics, HasSubstr("tandem_time_to_first_token_seconds_bucket"));
  const std::string path =
      ::testing::TempDir() + "/metrics_" + std::to_string(daemon_->metrics_port());
  std::ofstream(path) << *metrics;
  const int rc =
      std::system(("promtool check metrics < " + path + " > " + path + ".out 2>&1").c_str());
  std::ifstream out(path + ".out");
  std::string report((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << "promtool: " << report;
}

TEST_F(TandemdTest, ReflectionListsTheServices) {
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(
      grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  auto stream = stub->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("");
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  std::vector<std::string> services;
  for (const auto& s : response.list_services_response().service()) services.push_back(s.name());
  EXPECT_THAT(services, ::testing::IsSupersetOf({"tandem.v1.Generation", "grpc.health.v1.Health"}));
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(TandemdTest, TheCliStreamsAnAnswer) {
  const std::string out = ::testing::TempDir() + "/cli_" + std::to_string(daemon_->metrics_port());
  const std::string command =
      PathFromEnv("TANDEM_CLI", paths::kCli) +
      " chat \"What is the capital of France?\" --temperature=0 --server=" + daemon_->address() +
      " > " + out + " 2> " + out + ".err";
  ASSERT_EQ(std::system(command.c_str()), 0);
  std::ifstream answer(out), summary(out + ".err");
  const std::string text((std::istreambuf_iterator<char>(answer)),
                         std::istreambuf_iterator<char>());
  const std::string info((std::istreambuf_iterator<char>(summary)),
                         std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("Paris"));
  EXPECT_THAT(info, HasSubstr("finish_reason=stop"));
}

// `--help` of both binaries lists their commands and flags (Abseil's default
// would print "No flags matched" for files not named after the binary).
TEST(CliHelpTest, BothBinariesListTheirFlags) {
  const std::string out = ::testing::TempDir() + "/help";
  struct Case {
    std::string binary;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {PathFromEnv("TANDEM_CLI", paths::kCli),
       {"tandem chat", "tandem generate", "tandem shape", "--max_tokens", "--temperature",
        "--server"}},
      {PathFromEnv("TANDEM_DAEMON", paths::kDaemon),
       {"--threads", "--decode_reserved_threads", "--disagg_output_threshold",
        "--default_temperature", "--decode_step_interval"}},
  };
  for (const Case& c : cases) {
    const std::string command = c.binary + " --help > " + out + " 2>&1";
    // --help exits non-zero by Abseil's convention: only a failure to run counts.
    if (std::system(command.c_str()) == -1) ADD_FAILURE() << "cannot run " << c.binary;
    std::ifstream help(out);
    const std::string text((std::istreambuf_iterator<char>(help)),
                           std::istreambuf_iterator<char>());
    EXPECT_THAT(text, ::testing::Not(HasSubstr("No flags matched"))) << c.binary;
    for (const std::string& e : c.expected) EXPECT_THAT(text, HasSubstr(e)) << c.binary;
  }
}

// The repeated 1,000-token prompt of a coding agent's or chat's next turn.
TEST_F(TandemdTest, ARepeatedLongPromptIsServedFromThePrefixCache) {
  auto stub = daemon_->Stub();
  v1::GenerateRequest request;
  for (int i = 0; i < 1000; ++i)
    request.add_token_ids(static_cast<uint32_t>(200 + (i * 7919) % 40000));
  request.set_max_tokens(16);
  request.mutable_sampling()->set_temperature(0.0f);
  request.set_ignore_eos(true);
  Generation first = Generate(*stub, request);
  Generation second = Generate(*stub, request);
  ASSERT_TRUE(first.status.ok() && second.status.ok());
  EXPECT_EQ(first.last.usage().cached_prompt_tokens(), 0);
  EXPECT_GE(second.last.usage().cached_prompt_tokens(), 992);
  EXPECT_EQ(second.token_ids, first.token_ids);
  // Another tenant's salt sees none of it.
  request.set_cache_salt("tenant-b");
  Generation salted = Generate(*stub, request);
  EXPECT_EQ(salted.last.usage().cached_prompt_tokens(), 0);
  EXPECT_EQ(salted.token_ids, first.token_ids);
  std::printf("time to first token: %.1f ms, then %.1f ms from the cache\n",
              first.last.timeline().first_token_ms(), second.last.timeline().first_token_ms());
  const std::optional<std::string> metrics = HttpGet(daemon_->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_GE(MetricValue(*metrics, "tandem_prefix_cache_hit_tokens_total").value_or(0), 992);
  EXPECT_GE(MetricValue(*metrics, "tandem_prefix_cache_queried_tokens_total").value_or(0), 3000);
}

TEST_F(TandemdTest, AThreeTurnChatHitsTheCacheOnTurnsTwoAndThree) {
  auto stub = daemon_->Stub();
  v1::GenerateRequest request = Chat("Name a fruit.", 0.0f, 24);
  std::vector<int> prompt_tokens, cached;
  for (const char* next : {"Name another one.", "And a vegetable?", ""}) {
    Generation g = Generate(*stub, request);
    ASSERT_TRUE(g.status.ok());
    prompt_tokens.push_back(g.last.usage().prompt_tokens());
    cached.push_back(g.last.usage().cached_prompt_tokens());
    if (*next == '\0') break;
    auto* answer = request.add_messages();
    answer->set_role("assistant");
    answer->set_content(g.text);
    auto* user = request.add_messages();
    user->set_role("user");
    user->set_content(next);
  }
  EXPECT_EQ(cached[0], 0);
  // Each turn reuses at least the blocks of the previous turn's whole prompt.
  EXPECT_GE(cached[1], prompt_tokens[0] / 16 * 16);
  EXPECT_GE(cached[2], prompt_tokens[1] / 16 * 16);
  EXPECT_GT(cached[2], cached[1]);
}

// Daemons with their own lifetimes.

// A KV cache far too small for the load: sequences are preempted and cached
// blocks evicted, and nobody can tell from the answers.
TEST(TandemdLifecycleTest, ATinyKvCacheChangesNoAnswer) {
  Daemon roomy({"--context_length=256"});
  // 40 blocks of 16 tokens (368,640 bytes each): 8 requests of 60 + 100 tokens need 80.
  Daemon tiny({"--context_length=256", "--kv_cache_bytes=14745600"});
  ASSERT_TRUE(roomy.WaitServing()) << roomy.Log();
  ASSERT_TRUE(tiny.WaitServing()) << tiny.Log();
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    v1::GenerateRequest r;
    for (int t = 0; t < 60; ++t)
      r.add_token_ids(static_cast<uint32_t>(300 + (t * 31 + i * 977) % 30000));
    r.set_max_tokens(100);
    r.set_ignore_eos(true);
    r.mutable_sampling()->set_temperature(i % 2 == 0 ? 0.0f : 0.8f);
    r.mutable_sampling()->set_seed(static_cast<uint64_t>(i));
    requests.push_back(r);
  }
  auto run_all = [&](Daemon& d) {
    std::vector<std::future<Generation>> futures;
    for (const auto& r : requests) {
      futures.push_back(std::async(std::launch::async, [&d, &r] {
        auto stub = d.Stub();
        return Generate(*stub, r);
      }));
    }
    std::vector<std::vector<uint32_t>> out;
    for (auto& f : futures) {
      Generation g = f.get();
      EXPECT_TRUE(g.status.ok()) << g.status.error_message();
      out.push_back(g.token_ids);
    }
    return out;
  };
  const auto expected = run_all(roomy);
  const auto squeezed = run_all(tiny);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(squeezed[i], expected[i]) << "request " << i;
    EXPECT_EQ(squeezed[i].size(), 100u);
  }
  const std::optional<std::string> metrics = HttpGet(tiny.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_GT(MetricValue(*metrics, "tandem_preemptions_total").value_or(0), 0);
  EXPECT_GT(MetricValue(*metrics, "tandem_kv_cache_evictions_total").value_or(0), 0);
  EXPECT_EQ(MetricValue(*metrics, "tandem_kv_cache_used_blocks"), 0.0);  // all returned
  EXPECT_EQ(tiny.Stop(SIGTERM), 0);
  EXPECT_EQ(roomy.Stop(SIGTERM), 0);
}

TEST(TandemdLifecycleTest, SigtermWithEightStreamsInFlightFinishesAllAndExitsZero) {
  // A drain timeout far beyond the streams' length, even on the
  // ThreadSanitizer build (scripts/test --sanitize=thread), ~25x slower.
  Daemon daemon({"--drain_timeout=180s"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();
  std::vector<std::future<Generation>> streams;
  for (int i = 0; i < 8; ++i) {
    streams.push_back(std::async(std::launch::async, [&daemon, i] {
      auto own = daemon.Stub();
      v1::GenerateRequest r = Chat("Count to twenty.", 0.0f, 40);
      r.set_ignore_eos(true);
      r.mutable_sampling()->set_seed(static_cast<uint64_t>(i));
      return Generate(*own, r);
    }));
  }
  // All eight admitted before the signal (40 tokens each outlast the poll).
  ASSERT_TRUE(daemon.WaitForLoad([](const v1::Load& l) {
    return l.waiting() == 0 && l.running_prefill() + l.running_decode() == 8;
  }));
  EXPECT_EQ(daemon.Stop(SIGTERM), 0) << daemon.Log();
  for (auto& s : streams) {
    Generation g = s.get();
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.token_ids.size(), 40u);
  }
}

TEST(TandemdLifecycleTest, ACorruptModelFileIsAClearStartupError) {
  const std::string path =
      ::testing::TempDir() + "/corrupt_" + std::to_string(FreeLoopbackPort()) + ".gguf";
  {
    std::ifstream in(PathFromEnv("TANDEM_TEST_MODEL", paths::kTestModel), std::ios::binary);
    std::vector<char> head(10 << 20);  // the metadata, and part of the tensors
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::ofstream(path, std::ios::binary).write(head.data(), in.gcount());  // truncated copy
  }
  Daemon daemon({"--model=" + path});
  EXPECT_EQ(daemon.WaitExit(std::chrono::seconds(30)), 1);
  EXPECT_THAT(daemon.Log(), HasSubstr("invalid GGUF file"));
  EXPECT_THAT(daemon.Log(), HasSubstr("extends past the end of the file"));
  std::remove(path.c_str());
}

TEST(TandemdLifecycleTest, KvCacheAndLimitFlagsThatCannotWorkStopTheDaemonNamingTheFlag) {
  ExpectStartupErrors({
      // 200 TiB: more than any x86-64 process can map, whatever the
      // machine's overcommit policy.
      {{"--kv_cache_bytes=219902325555200"},
       1,
       "--kv_cache_bytes=219902325555200 (596523235 blocks): cannot map"},
      // More blocks than 32-bit block ids address (not a wrapped count).
      {{"--kv_cache_bytes=1000000000000000"}, 1, "are addressable"},
      {{"--max_queued_tokens=-1"}, 2, "--max_queued_tokens must be >= 0"},
      {{"--max_prompt_tokens=-1"}, 2, "--max_prompt_tokens must be >= 0"},
      {{"--default_deadline=-1s"}, 2, "--default_deadline must be >= 0 (got -1s)"},
      {{"--slow_reader_timeout=-2s"}, 2, "--slow_reader_timeout must be >= 0 (got -2s)"},
      {{"--max_concurrent_streams=0"}, 2, "--max_concurrent_streams must be at least 1"},
      {{"--inject_fault=prefill:explode@3"}, 2, "the kind is not error, throw, stall or overread"},
      {{"--inject_fault=prefill:stall@2"}, 2, "a stall needs a positive DURATION"},
      {{"--device=tpu"}, 2, "--device='tpu': expected auto, cpu or cuda"},
      // No GPU here (on a GPU machine this build still has no CUDA backend).
      {{"--device=cuda"}, 2, "--device=cuda: "},
      {{"--model=random:gpt-5"},
       1,
       "known: llama3-8b, llama3.2-1b, qwen2.5-3b, qwen2.5-7b, qwen3-8b, olmoe-1b-7b, "
       "smollm2-135m"},
      {{"--kv_cache_memory_fraction=1.5"}, 2, "--kv_cache_memory_fraction=1.5: must be in [0, 1)"},
      {{"--cuda_decode_sms=-2"}, 2, "--cuda_decode_sms=-2: expected -1 (auto), 0 (off)"},
      // A fraction too small for one full-context sequence names itself.
      {{"--kv_cache_memory_fraction=1e-12"}, 1, "--kv_cache_memory_fraction=1e-12 ("},
  });
}

// --kv_cache_memory_fraction sizes the KV cache from the memory free at
// start-up (MemAvailable on the CPU): the blocks GetModelInfo reports are
// that fraction of it, within what other tests running beside this one may
// take or give back meanwhile.
TEST(TandemdLifecycleTest, TheKvCacheMemoryFractionSizesTheCacheFromFreeMemory) {
  auto mem_available = [] {
    std::ifstream meminfo("/proc/meminfo");
    std::string line;
    long long kib = 0;
    while (std::getline(meminfo, line)) {
      if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kib) == 1) break;
    }
    return static_cast<double>(kib) * 1024;
  };
  const double before = mem_available();
  // A short context, so that 2% of a small machine's memory holds one
  // sequence; the CPU, whose free memory is MemAvailable.
  Daemon daemon({"--kv_cache_memory_fraction=0.02", "--context_length=256", "--device=cpu"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();
  v1::ModelInfo info;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  const double bytes_per_block = 368640;  // SmolLM2-135M, 16 tokens a block
  const double expected = 0.02 * before / bytes_per_block;
  EXPECT_GT(info.kv_blocks(), 0.5 * expected) << daemon.Log();
  EXPECT_LT(info.kv_blocks(), 1.5 * expected) << daemon.Log();
}

// --model=random:NAME serves a model of that shape with random weights, and
// --device=auto says where it runs and why.
TEST(TandemdLifecycleTest, ARandomWeightsModelIsServedAndTheDeviceChoiceIsLogged) {
  Daemon daemon({"--model=random:smollm2-135m", "--device=auto", "--cpu_matmul=auto"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  EXPECT_THAT(daemon.Log(), HasSubstr("device: cpu (--device=auto: "));
  EXPECT_THAT(daemon.Log(), HasSubstr("; serving on the CPU)"));
  // --cpu_matmul=auto (the default; tests' daemons otherwise run f32) says
  // what it measured and chose, and never chooses q8.
  EXPECT_THAT(daemon.Log(), HasSubstr("--cpu_matmul=auto: "));
  EXPECT_THAT(daemon.Log(), ::testing::Not(HasSubstr("--cpu_matmul=auto: q8 ")));
  auto stub = daemon.Stub();
  v1::ModelInfo info;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.name(), "random:smollm2-135m");
  EXPECT_EQ(info.vocab_size(), 49152);
  v1::GenerateRequest request;
  request.set_prompt("Hello");
  request.set_max_tokens(16);
  request.set_ignore_eos(true);
  request.mutable_sampling()->set_temperature(0.0f);
  const Generation g = Generate(*stub, request);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.token_ids.size(), 16u);
  EXPECT_EQ(g.last.usage().prompt_tokens(), 5) << "one token per byte";
}

// Injected faults (--inject_fault): a failing step fails the requests in it
// and nothing else; a stalled worker turns health NOT_SERVING and back.
void ExpectAFailedStepFailsOnlyItsRequest(const std::string& fault, const std::string& message) {
  // One request per step (max_running 1, one-step requests), so step 3 is
  // the third request's.
  Daemon daemon({"--inject_fault=" + fault, "--max_running=1", "--disagg_output_threshold=off",
                 "--prefix_caching=false", "--speculative=off"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();
  auto one_step = [&](uint32_t first) {
    v1::GenerateRequest r;
    for (uint32_t t = 0; t < 5; ++t) r.add_token_ids(first + t);
    r.set_max_tokens(1);
    r.mutable_sampling()->set_temperature(0.0f);
    return Generate(*stub, r);
  };
  EXPECT_TRUE(one_step(100).status.ok());
  EXPECT_TRUE(one_step(200).status.ok());
  Generation failed = one_step(300);
  EXPECT_EQ(failed.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(failed.status.error_message(), HasSubstr(message));
  Generation after = one_step(400);
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.token_ids.size(), 1u);
  // Every block came back (nothing is cached with prefix caching off).
  EXPECT_TRUE(daemon.WaitForLoad([](const v1::Load& l) {
    return l.kv_used_blocks() == 0 && l.waiting() == 0 &&
           l.running_prefill() + l.running_decode() == 0;
  }));
  EXPECT_EQ(daemon.Health(), "SERVING");
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(TandemdLifecycleTest, AStepThatReturnsAnErrorFailsOnlyItsRequestsWithInternal) {
  ExpectAFailedStepFailsOnlyItsRequest("prefill:error@3", "injected fault: step 3 failed");
}

TEST(TandemdLifecycleTest, AStepThatThrowsFailsOnlyItsRequestsWithInternal) {
  ExpectAFailedStepFailsOnlyItsRequest("prefill:throw@3",
                                       "the worker failed: injected fault: step 3 threw");
}

TEST(TandemdLifecycleTest, AStalledWorkerTurnsHealthNotServingAndBack) {
  Daemon daemon({"--inject_fault=prefill:stall@1:4s", "--stall_timeout=1s"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();
  auto call = std::async(std::launch::async, [&] { return Generate(*stub, Chat("Hi", 0.0f, 3)); });
  EXPECT_TRUE(daemon.WaitForHealth("NOT_SERVING", std::chrono::seconds(30)));
  EXPECT_TRUE(daemon.WaitForHealth("SERVING", std::chrono::seconds(30)));
  Generation g = call.get();
  EXPECT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.token_ids.size(), 3u);
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(TandemdLifecycleTest, AMissingModelAndAnUnknownTemplateAreClearStartupErrors) {
  Daemon missing({"--model=/nonexistent/model.gguf"});
  EXPECT_EQ(missing.WaitExit(std::chrono::seconds(30)), 1);
  EXPECT_THAT(missing.Log(), HasSubstr("cannot open model file '/nonexistent/model.gguf'"));
  Daemon bad_template({"--chat_template=alpaca"});
  EXPECT_EQ(bad_template.WaitExit(std::chrono::seconds(30)), 1);
  EXPECT_THAT(bad_template.Log(), HasSubstr("--chat_template='alpaca' is not a known template"));
}

}  // namespace
}  // namespace tandem::testing
