// Starts tandemd as a child process on free ports for end-to-end tests, and
// talks to it over real gRPC and HTTP.
#ifndef TANDEM_TESTS_E2E_DAEMON_H_
#define TANDEM_TESTS_E2E_DAEMON_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/free_port.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::testing {

// $NAME if set, else `fallback` (the paths CMake configured).
std::string PathFromEnv(const char* name, const char* fallback);

// The value of an unlabelled sample `name` in Prometheus text, or nullopt.
std::optional<double> MetricValue(const std::string& text, const std::string& name);

// The sum of tandem_requests_total over every path for the finish reasons
// given (every reason by default): the requests the scheduler finished.
double FinishedRequests(const std::string& metrics, const std::vector<std::string>& reasons = {
                                                        "stop", "length", "cancelled", "error"});

// GET http://127.0.0.1:port/path; the body, or nullopt when unreachable.
std::optional<std::string> HttpGet(int port, const std::string& path);

class Daemon {
 public:
  // Starts $TANDEM_DAEMON with --model=$TANDEM_TEST_MODEL, fresh ports and
  // `extra` flags. Does not wait.
  explicit Daemon(std::vector<std::string> extra = {});
  ~Daemon();  // SIGKILLs the daemon if it is still running

  // Waits until grpc.health.v1 says SERVING; false on timeout or early exit.
  bool WaitServing(std::chrono::seconds timeout = std::chrono::seconds(60));
  // Sends `signal` and waits for the exit; returns the exit code (or 128 +
  // the signal that killed it, or -1 on timeout).
  int Stop(int signal, std::chrono::seconds timeout = std::chrono::seconds(60));
  // Waits for the process to exit by itself; like Stop().
  int WaitExit(std::chrono::seconds timeout);
  // Everything the daemon wrote to stderr so far.
  std::string Log() const;
  // The health status of service "" (SERVING, NOT_SERVING...), or the RPC error.
  std::string Health();

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }
  int metrics_port() const { return metrics_port_; }
  // The OpenAI-compatible HTTP API's port (a later --http_port in the
  // extra flags overrides it).
  int http_port() const { return http_port_; }
  std::unique_ptr<v1::Generation::Stub> Stub() const;
  // Polls GetLoad until `done(load)` holds; false after `timeout`. How tests
  // wait for requests to be admitted (never a fixed sleep).
  bool WaitForLoad(const std::function<bool(const v1::Load&)>& done,
                   std::chrono::seconds timeout = std::chrono::seconds(60));
  // Polls health until it reports `status` ("SERVING", "NOT_SERVING"...).
  bool WaitForHealth(const std::string& status,
                     std::chrono::seconds timeout = std::chrono::seconds(60));

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
  int http_port_ = 0;
  std::string log_path_;
  std::optional<int> exit_code_;
};

// A daemon started with `flags` must exit by itself with `exit_code` (2: a
// bad flag; 1: the model cannot be served so) and log `message`.
struct StartupErrorCase {
  std::vector<std::string> flags;
  int exit_code;
  std::string message;
};
void ExpectStartupErrors(const std::vector<StartupErrorCase>& cases);

// The outcome of one streamed Generate call.
struct Generation {
  grpc::Status status;
  std::string text;
  std::vector<uint32_t> token_ids;
  std::vector<v1::GenerateResponse> messages;
  v1::GenerateResponse last;
};

Generation Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                    std::chrono::milliseconds timeout = std::chrono::minutes(5));

v1::GenerateRequest Chat(const std::string& user_message, std::optional<float> temperature,
                         int max_tokens);

// A greedy request of `count` token ids (a pattern that differs by `salt`)
// for exactly `max_tokens` (EOS ignored).
v1::GenerateRequest Tokens(int count, int salt, int max_tokens);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_E2E_DAEMON_H_
