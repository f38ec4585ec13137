// The servers `tandem bench` drives: tandemd over gRPC (one or more
// addresses, requests spread round-robin), llama.cpp's llama-server's own
// /completion and any OpenAI-compatible server over HTTP with server-sent
// events, all given the same token ids.
#ifndef TANDEM_CLIENT_BENCH_TARGETS_H_
#define TANDEM_CLIENT_BENCH_TARGETS_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "client/bench/stats.h"
#include "client/bench/workload.h"

namespace tandem::bench {

// Seconds on the steady clock every record is stamped with.
double NowSeconds();

struct GenerateCall {
  TokenIds prompt;
  int max_tokens = 0;
  std::string workload;  // tandemd's workload tag
  // The class's SLOs, sent as the request's latency budget (tandemd's
  // latency_budget; ms, 0: none).
  double slo_ttft_ms = 0;
  double slo_tpot_ms = 0;
  double timeout_s = 600;
  // Stop where the model ends its answer (end of sequence or of turn, the
  // server's stop tokens); false: exactly max_tokens, end of sequence ignored.
  bool stop_at_end = false;
  // Fill Generated::text (the OpenAI target then parses every chunk, where
  // it otherwise only counts token ids).
  bool want_text = false;
  // The session the request is a turn of ("" none), sent as the
  // x-session-id header (gRPC metadata) that deploy/lb's balancers hash to
  // keep a session on one daemon, where its prefix is cached.
  std::string session_id;
};

// The header (gRPC metadata key) GenerateCall::session_id goes out as.
inline constexpr char kSessionHeader[] = "x-session-id";

// `call`'s session header for an HTTP request: none without a session.
std::vector<std::pair<std::string, std::string>> SessionHeaders(const GenerateCall& call);

// What one request generated.
struct Generated {
  TokenIds ids;
  std::string text;  // as the server streamed it (with GenerateCall::want_text)
};

// A message of a conversation (tandemd's ChatMessage, text only).
struct ChatTurn {
  std::string role;  // system, user or assistant
  std::string content;
};

class Target {
 public:
  virtual ~Target() = default;
  virtual std::string name() const = 0;
  virtual absl::StatusOr<TokenIds> Tokenize(const std::string& text) = 0;
  // The token ids of `messages` rendered by the model's chat template with
  // the assistant's turn opened (as Generate would render them). Only
  // tandemd renders chats; other targets get their chat prompts from it.
  virtual absl::StatusOr<TokenIds> TokenizeChat(const std::vector<ChatTurn>& messages);
  // Sends one greedy request (whose output is exactly max_tokens long unless
  // call.stop_at_end) and fills `record` (token times, ok/error, prompt and
  // cached tokens, path, speculation and whether it stopped on its own; not
  // start or class) and `output`. Blocks until the stream ends. Thread-safe.
  virtual void Generate(const GenerateCall& call, RequestRecord* record, Generated* output) = 0;
  // Prometheus metrics URLs of the servers behind this target ("" none).
  virtual std::vector<std::string> MetricsUrls() const { return {}; }
};

// `addresses` are host:port gRPC endpoints; `metrics_urls` their metrics
// pages (may be empty).
std::unique_ptr<Target> MakeTandemTarget(std::vector<std::string> addresses,
                                         std::vector<std::string> metrics_urls);

// `address` is llama-server's host:port.
std::unique_ptr<Target> MakeLlamaServerTarget(std::string address);

// Any OpenAI-compatible server at `address` (host:port; /v1/completions).
// Prompts are tokenized by `tokenizer` (tandemd serving the same model),
// which must outlive the target.
std::unique_ptr<Target> MakeOpenAiTarget(std::string address, Target* tokenizer);

}  // namespace tandem::bench

#endif  // TANDEM_CLIENT_BENCH_TARGETS_H_
