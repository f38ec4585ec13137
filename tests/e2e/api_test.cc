// The public API end to end: every RPC, logprobs, the queue limit, draining,
// API keys, TLS and mTLS, JSON logs, and metrics that count exactly what was
// sent.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/e2e/daemon.h"
#include "tests/test_paths.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

// A daemon for the tests that only send requests. ctest runs each test in a
// process of its own (gtest_discover_tests), so each test starts one (about
// a second); run the binary directly and the suite shares one. Tests here
// must therefore not depend on what another test left in the daemon.
class ApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new Daemon();
    ASSERT_TRUE(daemon_->WaitServing()) << daemon_->Log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(daemon_->Stop(SIGTERM), 0);
    delete daemon_;
  }
  static Daemon* daemon_;
};
Daemon* ApiTest::daemon_ = nullptr;

template <typename Request, typename Response, typename Call>
grpc::Status Unary(Call call, const Request& request, Response* response,
                   const std::string& api_key = "") {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
  if (!api_key.empty()) context.AddMetadata("authorization", "Bearer " + api_key);
  return call(&context, request, response);
}

TEST_F(ApiTest, GenerateUnaryAnswersWhatTheStreamAnswers) {
  auto stub = daemon_->Stub();
  v1::GenerateRequest request = Chat("Name three colors.", 0.0f, 20);
  request.set_request_id("unary-1");
  Generation streamed = Generate(*stub, request);
  v1::GenerateResponse unary;
  const grpc::Status status =
      Unary([&](grpc::ClientContext* c, const v1::GenerateRequest& r,
                v1::GenerateResponse* out) { return stub->GenerateUnary(c, r, out); },
            request, &unary);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(unary.request_id(), "unary-1");
  EXPECT_EQ(unary.text(), streamed.text);
  EXPECT_EQ(std::vector<uint32_t>(unary.token_ids().begin(), unary.token_ids().end()),
            streamed.token_ids);
  EXPECT_EQ(unary.finish_reason(), streamed.last.finish_reason());
  EXPECT_EQ(unary.usage().completion_tokens(), static_cast<int>(streamed.token_ids.size()));
  EXPECT_GT(unary.timeline().total_ms(), 0);
  EXPECT_NE(unary.path(), v1::PATH_UNSPECIFIED);

  v1::GenerateRequest bad;
  const grpc::Status invalid =
      Unary([&](grpc::ClientContext* c, const v1::GenerateRequest& r,
                v1::GenerateResponse* out) { return stub->GenerateUnary(c, r, out); },
            bad, &unary);
  EXPECT_EQ(invalid.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ApiTest, TokenizeGivesTheTokensGenerateSees) {
  auto stub = daemon_->Stub();
  auto tokenize = [&](const v1::TokenizeRequest& r, v1::TokenizeResponse* out) {
    return Unary([&](grpc::ClientContext* c, const v1::TokenizeRequest& req,
                     v1::TokenizeResponse* o) { return stub->Tokenize(c, req, o); },
                 r, out);
  };
  v1::TokenizeRequest text;
  text.set_text("Hello, world! <|im_start|>");
  v1::TokenizeResponse tokens;
  ASSERT_TRUE(tokenize(text, &tokens).ok());
  EXPECT_EQ(tokens.token_ids_size(), tokens.tokens_size());
  std::string joined;
  for (const std::string& t : tokens.tokens()) joined += t;
  EXPECT_EQ(joined, text.text());
  EXPECT_EQ(tokens.token_ids(tokens.token_ids_size() - 1), 1u);  // <|im_start|>

  v1::TokenizeRequest chat;
  *chat.add_messages() = Chat("What is 2+2?", 0.0f, 1).messages(0);
  ASSERT_TRUE(tokenize(chat, &tokens).ok());
  Generation g = Generate(*stub, Chat("What is 2+2?", 0.0f, 1));
  EXPECT_EQ(tokens.token_ids_size(), g.last.usage().prompt_tokens());

  v1::TokenizeRequest both = chat;
  both.set_text("also text");
  const grpc::Status s = tokenize(both, &tokens);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("exactly one of text and messages"));
}

TEST_F(ApiTest, GetModelInfoDescribesWhatIsServed) {
  auto stub = daemon_->Stub();
  v1::ModelInfo info;
  ASSERT_TRUE(Unary([&](grpc::ClientContext* c, const v1::GetModelInfoRequest& r,
                        v1::ModelInfo* o) { return stub->GetModelInfo(c, r, o); },
                    v1::GetModelInfoRequest(), &info)
                  .ok());
  EXPECT_THAT(info.name(), HasSubstr("Smollm2 135M"));
  EXPECT_EQ(info.architecture(), "llama");
  EXPECT_EQ(info.context_length(), 8192);
  EXPECT_EQ(info.vocab_size(), 49152);
  EXPECT_EQ(info.chat_template(), "model");  // its own template, run by our interpreter
  EXPECT_EQ(info.dtype(), "Q4_1");
  ASSERT_EQ(info.backends_size(), 2);
  EXPECT_THAT(info.backends(0), HasSubstr("prefill: cpu"));
  EXPECT_THAT(info.backends(1), HasSubstr("decode: cpu"));
  EXPECT_EQ(info.kv_block_size(), 16);
  EXPECT_EQ(info.kv_blocks(), 1456);
  // The SLO policy by default: no threshold; the budgets and what the
  // step-time model has learned so far.
  EXPECT_EQ(info.disagg_output_threshold(), -1);
  EXPECT_EQ(info.policy(), "slo");
  EXPECT_EQ(info.slo_ttft_ms(), 1000);
  EXPECT_EQ(info.slo_tpot_ms(), 100);
  EXPECT_THAT(info.step_time_model(), HasSubstr("ms/token"));
  EXPECT_TRUE(info.slo_crossover_tokens() == -1 || info.slo_crossover_tokens() >= 1)
      << info.slo_crossover_tokens();
}

TEST_F(ApiTest, GetLoadReportsQueueWorkersAndKv) {
  auto stub = daemon_->Stub();
  auto load = [&] {
    v1::Load l;
    EXPECT_TRUE(Unary([&](grpc::ClientContext* c, const v1::GetLoadRequest& r,
                          v1::Load* o) { return stub->GetLoad(c, r, o); },
                      v1::GetLoadRequest(), &l)
                    .ok());
    return l;
  };
  const v1::Load idle = load();
  EXPECT_EQ(idle.waiting(), 0);
  EXPECT_EQ(idle.running_prefill() + idle.running_decode(), 0);
  EXPECT_EQ(idle.kv_used_blocks(), 0);
  EXPECT_EQ(idle.kv_total_blocks(), 1456);
  EXPECT_TRUE(idle.accepting());
  // While a long stream runs.
  v1::GenerateRequest r = Chat("Write a long story.", 0.0f, 400);
  r.set_ignore_eos(true);
  grpc::ClientContext context;
  auto reader = stub->Generate(&context, r);
  v1::GenerateResponse first;
  ASSERT_TRUE(reader->Read(&first));
  const v1::Load busy = load();
  EXPECT_EQ(busy.running_prefill() + busy.running_decode(), 1);
  EXPECT_GT(busy.kv_used_blocks(), 0);
  EXPECT_GT(busy.kv_usage(), 0.0);
  context.TryCancel();
  while (reader->Read(&first)) {
  }
  reader->Finish();
}

TEST_F(ApiTest, LogprobsAreTheModelsDistribution) {
  auto stub = daemon_->Stub();
  v1::GenerateRequest r = Chat("Name a planet.", 0.0f, 12);
  r.set_logprobs(5);
  r.set_ignore_eos(true);
  Generation g = Generate(*stub, r);
  ASSERT_TRUE(g.status.ok());
  std::vector<v1::TokenLogprobs> logprobs;
  for (const auto& m : g.messages)
    logprobs.insert(logprobs.end(), m.logprobs().begin(), m.logprobs().end());
  ASSERT_EQ(logprobs.size(), g.token_ids.size());
  for (size_t i = 0; i < logprobs.size(); ++i) {
    const v1::TokenLogprobs& lp = logprobs[i];
    EXPECT_EQ(lp.token_id(), g.token_ids[i]);
    ASSERT_EQ(lp.top_size(), 5);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(lp.top(0).token_id(), lp.token_id());
    EXPECT_FLOAT_EQ(lp.top(0).logprob(), lp.logprob());
    double mass = 0;
    for (int k = 0; k < 5; ++k) {
      if (k > 0) {
        EXPECT_LE(lp.top(k).logprob(), lp.top(k - 1).logprob());
      }
      EXPECT_LE(lp.top(k).logprob(), 0.0f);
      mass += std::exp(static_cast<double>(lp.top(k).logprob()));
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
  }
  r.set_logprobs(21);
  Generation bad = Generate(*stub, r);
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.status.error_message(), HasSubstr("logprobs"));
}

TEST_F(ApiTest, TheShapeCommandReadsTheMetrics) {
  auto stub = daemon_->Stub();
  ASSERT_TRUE(Generate(*stub, Chat("Say yes.", 0.0f, 4)).status.ok());
  const std::string out =
      ::testing::TempDir() + "/shape_" + std::to_string(daemon_->metrics_port());
  const std::string command =
      PathFromEnv("TANDEM_CLI", paths::kCli) +
      " shape --metrics=http://127.0.0.1:" + std::to_string(daemon_->metrics_port()) +
      "/metrics > " + out;
  ASSERT_EQ(std::system(command.c_str()), 0);
  std::ifstream in(out);
  const std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(report, HasSubstr("generated tokens per request"));
  EXPECT_THAT(report, HasSubstr("SLO attainment: TTFT"));
  EXPECT_THAT(report, HasSubstr("Policy: slo"));
}

// Daemons of their own.

TEST(ApiLifecycleTest, AFullQueueAnswersResourceExhausted) {
  Daemon daemon({"--max_queued_requests=2", "--max_running=1", "--disagg_output_threshold=off"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  std::vector<std::future<Generation>> calls;
  for (int i = 0; i < 10; ++i) {
    calls.push_back(std::async(std::launch::async, [&daemon] {
      auto stub = daemon.Stub();
      v1::GenerateRequest r = Chat("Tell me a story.", 0.0f, 40);
      r.set_ignore_eos(true);
      return Generate(*stub, r);
    }));
  }
  int exhausted = 0, ok = 0;
  for (auto& c : calls) {
    Generation g = c.get();
    if (g.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
      EXPECT_THAT(g.status.error_message(), HasSubstr("queue is full"));
    } else {
      EXPECT_TRUE(g.status.ok()) << g.status.error_message();
      ++ok;
    }
  }
  EXPECT_GT(exhausted, 0);
  // The queue always holds two; a third runs only if the scheduler moved the
  // first call out of the queue before the others arrived, which is timing.
  EXPECT_GE(ok, 2);
  EXPECT_EQ(ok + exhausted, 10);
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

v1::GenerateRequest TokenPrompt(int tokens, int max_tokens) {
  v1::GenerateRequest r;
  for (int t = 0; t < tokens; ++t) r.add_token_ids(static_cast<uint32_t>(2000 + t));
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0.0f);
  return r;
}

TEST(ApiLifecycleTest, PromptQueueAndDeadlineLimitsAnswerWithTheFlagNamed) {
  Daemon daemon({"--max_prompt_tokens=50", "--max_queued_tokens=80", "--default_deadline=2s",
                 "--max_running=1", "--disagg_output_threshold=off", "--speculative=off"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();
  // A prompt over --max_prompt_tokens.
  Generation too_long = Generate(*stub, TokenPrompt(51, 4));
  EXPECT_EQ(too_long.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(too_long.status.error_message(), HasSubstr("token_ids"));
  EXPECT_THAT(too_long.status.error_message(), HasSubstr("--max_prompt_tokens"));
  // A request with no client deadline gets --default_deadline: 1,500 tokens
  // take far longer than 2 s here, so it ends DEADLINE_EXCEEDED mid-stream.
  auto endless = std::async(std::launch::async, [&] {
    grpc::ClientContext context;  // no deadline
    auto reader = stub->Generate(&context, TokenPrompt(10, 1500));
    v1::GenerateResponse response;
    size_t tokens = 0;
    while (reader->Read(&response)) tokens += static_cast<size_t>(response.token_ids_size());
    return std::make_pair(reader->Finish(), tokens);
  });
  ASSERT_TRUE(daemon.WaitForLoad([](const v1::Load& l) { return l.running_prefill() == 1; }));
  // The running slot is taken: 50 prompt tokens wait (under the limit of 80)...
  auto waiting =
      std::async(std::launch::async, [&] { return Generate(*stub, TokenPrompt(50, 2)); });
  ASSERT_TRUE(daemon.WaitForLoad([](const v1::Load& l) { return l.waiting() == 1; }));
  // ... and 40 more would pass it.
  Generation refused = Generate(*stub, TokenPrompt(40, 2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("--max_queued_tokens=80"));
  const auto [endless_status, endless_tokens] = endless.get();
  EXPECT_EQ(endless_status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << endless_status.error_message();
  EXPECT_GT(endless_tokens, 0u);
  EXPECT_LT(endless_tokens, 1500u);
  Generation queued = waiting.get();  // its client deadline (5 min) is its own
  EXPECT_TRUE(queued.status.ok()) << queued.status.error_message();
  EXPECT_EQ(queued.token_ids.size(), 2u);
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(ApiLifecycleTest, AConnectionRunsAtMostMaxConcurrentStreamsCallsAtOnce) {
  Daemon daemon(
      {"--max_concurrent_streams=2", "--disagg_output_threshold=off", "--speculative=off"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  // One connection of its own for the four calls (channels with equal
  // arguments share a connection in gRPC, and GetLoad must not queue
  // behind the calls).
  grpc::ChannelArguments own;
  own.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto shared = v1::Generation::NewStub(
      grpc::CreateCustomChannel(daemon.address(), grpc::InsecureChannelCredentials(), own));
  std::vector<std::future<Generation>> calls;
  for (int i = 0; i < 4; ++i) {
    calls.push_back(std::async(std::launch::async,
                               [&shared, i] { return Generate(*shared, TokenPrompt(8 + i, 60)); }));
  }
  // GetLoad runs on channels of its own. Two calls run; the other two wait
  // in the client until a stream frees, so the daemon never holds more.
  int most = 0;
  ASSERT_TRUE(daemon.WaitForLoad([&most](const v1::Load& l) {
    most = std::max(most, l.waiting() + l.running_prefill() + l.running_decode());
    return l.running_prefill() >= 2;
  }));
  auto all_done = [&] {
    for (auto& c : calls) {
      if (c.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    }
    return true;
  };
  const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (!all_done() && std::chrono::steady_clock::now() < end) {
    daemon.WaitForLoad([&most](const v1::Load& l) {
      most = std::max(most, l.waiting() + l.running_prefill() + l.running_decode());
      return true;
    });
  }
  ASSERT_TRUE(all_done());
  EXPECT_EQ(most, 2);
  for (auto& c : calls) {
    Generation g = c.get();
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.token_ids.size(), 60u);
  }
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(ApiLifecycleTest, DrainingRefusesNewCallsAndCancelsStragglersWithUnavailable) {
  Daemon daemon({"--drain_timeout=6s"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();
  auto start_stream = [&](int tokens) {
    return std::async(std::launch::async, [&daemon, tokens] {
      auto own = daemon.Stub();
      v1::GenerateRequest r = Chat("Write an essay.", 0.0f, tokens);
      r.set_ignore_eos(true);
      return Generate(*own, r);
    });
  };
  // 10 tokens finish within the drain timeout even on the ThreadSanitizer
  // build (scripts/test --sanitize=thread), about 25x slower than this one.
  auto short_stream = start_stream(10);
  auto long_stream = start_stream(5000);  // does not (minutes on this CPU)
  // Both admitted (running, none waiting) before the signal.
  ASSERT_TRUE(daemon.WaitForLoad([](const v1::Load& l) {
    return l.waiting() == 0 && l.running_prefill() + l.running_decode() == 2;
  }));
  ::kill(daemon.pid(), SIGTERM);
  ASSERT_TRUE(daemon.WaitForHealth("NOT_SERVING"));
  Generation refused = Generate(*stub, Chat("Hi", 0.0f, 4));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(refused.messages.empty()) << "refused before any token, so callers can retry";
  Generation finished = short_stream.get();
  EXPECT_TRUE(finished.status.ok()) << finished.status.error_message();
  EXPECT_EQ(finished.token_ids.size(), 10u);
  Generation cut = long_stream.get();
  EXPECT_EQ(cut.status.error_code(), grpc::StatusCode::UNAVAILABLE) << cut.status.error_message();
  EXPECT_EQ(daemon.WaitExit(std::chrono::seconds(30)), 0);
}

TEST(ApiLifecycleTest, ApiKeysGuardEveryRpcButHealth) {
  const std::string keys = ::testing::TempDir() + "/keys_" + std::to_string(FreeLoopbackPort());
  std::ofstream(keys) << "# operators' keys\nsecret-key-1\n\n  secret-key-2  \n";
  Daemon daemon({"--api_keys_file=" + keys});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();  // health needs no key
  auto stub = daemon.Stub();
  v1::TokenizeRequest request;
  request.set_text("hello");
  v1::TokenizeResponse response;
  auto tokenize = [&](const std::string& key) {
    return Unary([&](grpc::ClientContext* c, const v1::TokenizeRequest& r,
                     v1::TokenizeResponse* o) { return stub->Tokenize(c, r, o); },
                 request, &response, key);
  };
  // Checked in gRPC's transport before any service code: the reasons are
  // named, and the refusals counted.
  const grpc::Status missing = tokenize("");
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(missing.error_message(), HasSubstr("missing 'authorization: Bearer <key>'"));
  const grpc::Status wrong = tokenize("wrong");
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(wrong.error_message(), "invalid API key");
  EXPECT_TRUE(tokenize("secret-key-1").ok());
  EXPECT_TRUE(tokenize("secret-key-2").ok());
  EXPECT_EQ(Generate(*stub, Chat("Hi", 0.0f, 2)).status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer secret-key-1");
  auto reader = stub->Generate(&context, Chat("Hi", 0.0f, 2));
  v1::GenerateResponse message;
  while (reader->Read(&message)) {
  }
  EXPECT_TRUE(reader->Finish().ok());
  std::optional<std::string> metrics = HttpGet(daemon.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(MetricValue(*metrics, "tandem_unauthenticated_calls_total"), 3.0);
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
  EXPECT_THAT(daemon.Log(), ::testing::Not(HasSubstr("secret-key")));
}

// Makes a CA, a server certificate for 127.0.0.1 and a client certificate.
std::string MakeCertificates() {
  const std::string dir = ::testing::TempDir() + "/tls_" + std::to_string(FreeLoopbackPort());
  const std::string script =
      "set -e; mkdir -p " + dir + "; cd " + dir +
      "; openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca -keyout ca.key "
      "-out ca.pem 2>/dev/null"
      "; printf 'subjectAltName=IP:127.0.0.1' > san.ext"
      "; openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out "
      "server.csr 2>/dev/null"
      "; openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile san.ext -out server.pem 2>/dev/null"
      "; openssl req -newkey rsa:2048 -nodes -subj /CN=client -keyout client.key -out "
      "client.csr 2>/dev/null"
      "; openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-out client.pem 2>/dev/null";
  EXPECT_EQ(std::system(("bash -c \"" + script + "\"").c_str()), 0);
  return dir;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

grpc::Status TlsCall(const std::string& address, const grpc::SslCredentialsOptions& ssl,
                     const std::string& api_key = "") {
  auto stub = v1::Generation::NewStub(grpc::CreateChannel(address, grpc::SslCredentials(ssl)));
  v1::ModelInfo info;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!api_key.empty()) context.AddMetadata("authorization", "Bearer " + api_key);
  return stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
}

bool TlsCallWorks(const std::string& address, const grpc::SslCredentialsOptions& ssl,
                  const std::string& api_key = "") {
  return TlsCall(address, ssl, api_key).ok();
}

TEST(ApiLifecycleTest, TlsAndMutualTls) {
  const std::string dir = MakeCertificates();
  grpc::SslCredentialsOptions trust;
  trust.pem_root_certs = Read(dir + "/ca.pem");
  {
    Daemon daemon({"--tls_cert=" + dir + "/server.pem", "--tls_key=" + dir + "/server.key"});
    // Health over an insecure channel fails against a TLS port; poll with TLS.
    bool up = false;
    for (int i = 0; i < 100 && !up; ++i) {
      up = TlsCallWorks(daemon.address(), trust);
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ASSERT_TRUE(up) << daemon.Log();
    EXPECT_NE(daemon.Health(), "SERVING") << "a plaintext client must not get through";
    EXPECT_EQ(daemon.Stop(SIGTERM), 0);
  }
  {
    // Mutual TLS, and API keys on top (checked the same way over TLS).
    const std::string keys = dir + "/keys";
    std::ofstream(keys) << "tls-key\n";
    Daemon daemon({"--tls_cert=" + dir + "/server.pem", "--tls_key=" + dir + "/server.key",
                   "--tls_client_ca=" + dir + "/ca.pem", "--api_keys_file=" + keys});
    grpc::SslCredentialsOptions with_cert = trust;
    with_cert.pem_private_key = Read(dir + "/client.key");
    with_cert.pem_cert_chain = Read(dir + "/client.pem");
    bool up = false;
    for (int i = 0; i < 100 && !up; ++i) {
      up = TlsCallWorks(daemon.address(), with_cert, "tls-key");
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ASSERT_TRUE(up) << daemon.Log();
    EXPECT_EQ(TlsCall(daemon.address(), with_cert).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_FALSE(TlsCallWorks(daemon.address(), trust, "tls-key"))
        << "no client certificate: refused";
    EXPECT_EQ(daemon.Stop(SIGTERM), 0);
  }
}

TEST(ApiLifecycleTest, JsonLogsAreOneObjectPerLine) {
  Daemon daemon({"--log_format=json"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();
  v1::GenerateRequest r = Chat("Hi \"there\"", 0.0f, 3);
  r.set_request_id("json-\"1\"");
  ASSERT_TRUE(Generate(*stub, r).status.ok());
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
  std::istringstream lines(daemon.Log());
  std::string line;
  int objects = 0;
  bool request_line = false;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    // Every line parses as one JSON object (protobuf's parser).
    google::protobuf::Struct parsed;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &parsed).ok()) << line;
    const auto& f = parsed.fields();
    EXPECT_TRUE(f.contains("level") && f.contains("time")) << line;
    ++objects;
    if (f.contains("event") && f.at("event").string_value() == "request_finished") {
      request_line = true;
      EXPECT_EQ(f.at("request_id").string_value(), "json-\"1\"");
      EXPECT_EQ(f.at("completion_tokens").number_value(), 3);
      EXPECT_EQ(f.at("path").string_value(), "colocated");
    }
  }
  EXPECT_GT(objects, 3);
  EXPECT_TRUE(request_line);
}

TEST(ApiLifecycleTest, MetricsCountExactlyWhatWasSent) {
  // The threshold policy: the 40-token answer moves at 32, deterministically.
  Daemon daemon({"--disagg_output_threshold=32"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();
  const std::vector<std::pair<int, int>> shapes = {{5, 3}, {17, 1}, {40, 9}, {8, 40}, {64, 2}};
  int prompt_total = 0, generated_total = 0, gaps = 0;
  for (const auto& [prompt, output] : shapes) {
    v1::GenerateRequest r;
    for (int t = 0; t < prompt; ++t) r.add_token_ids(static_cast<uint32_t>(1000 + t));
    r.set_max_tokens(output);
    r.set_ignore_eos(true);
    r.mutable_sampling()->set_temperature(0.0f);
    ASSERT_TRUE(Generate(*stub, r).status.ok());
    prompt_total += prompt;
    generated_total += output;
    gaps += output - 1;
  }
  ASSERT_EQ(Generate(*stub, v1::GenerateRequest()).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  const std::optional<std::string> text = HttpGet(daemon.metrics_port(), "/metrics");
  ASSERT_TRUE(text.has_value());
  auto value = [&](const std::string& name) { return MetricValue(*text, name).value_or(-1); };
  EXPECT_EQ(value("tandem_requests_total{finish_reason=\"length\",path=\"colocated\"}") +
                value("tandem_requests_total{finish_reason=\"length\",path=\"disaggregated\"}"),
            5);
  EXPECT_EQ(value("tandem_requests_total{finish_reason=\"length\",path=\"disaggregated\"}"), 1);
  EXPECT_EQ(value("tandem_prompt_tokens_total"), prompt_total);
  EXPECT_EQ(value("tandem_generated_tokens_total"), generated_total);
  EXPECT_EQ(value("tandem_rejected_requests_total"), 1);
  EXPECT_EQ(value("tandem_request_prompt_tokens_count"), 5);
  EXPECT_EQ(value("tandem_handoffs_total"), 1);
  EXPECT_EQ(value("tandem_inter_token_latency_seconds_count{path=\"colocated\"}") +
                value("tandem_inter_token_latency_seconds_count{path=\"disaggregated\"}"),
            gaps);
  EXPECT_EQ(value("tandem_time_to_first_token_seconds_count{path=\"colocated\"}") +
                value("tandem_time_to_first_token_seconds_count{path=\"disaggregated\"}"),
            5);
  EXPECT_GT(value("tandem_step_time_seconds_count{worker=\"prefill\"}"), 0);
  EXPECT_GT(value("tandem_step_time_seconds_count{worker=\"decode\"}"), 0);
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace tandem::testing
