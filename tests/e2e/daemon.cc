#include "tests/e2e/daemon.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/test_model.h"
#include "tests/test_paths.h"

extern char** environ;

namespace tandem::testing {

std::string PathFromEnv(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

std::optional<double> MetricValue(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return std::nullopt;
}

double FinishedRequests(const std::string& metrics, const std::vector<std::string>& reasons) {
  double finished = 0;
  for (const std::string& reason : reasons) {
    for (const char* path : {"colocated", "disaggregated", "remote"}) {
      finished += MetricValue(metrics, "tandem_requests_total{finish_reason=\"" + reason +
                                           "\",path=\"" + path + "\"}")
                      .value_or(0);
    }
  }
  return finished;
}

std::optional<std::string> HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return std::nullopt;
  }
  std::string response;
  char buffer[8192];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0)
    response.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return std::nullopt;
  return response.substr(body + 4);
}

Daemon::Daemon(std::vector<std::string> extra) {
  const std::string binary = PathFromEnv("TANDEM_DAEMON", paths::kDaemon);
  const std::string model = PathFromEnv("TANDEM_TEST_MODEL", paths::kTestModel);
  port_ = FreeLoopbackPort();
  metrics_port_ = FreeLoopbackPort();
  http_port_ = FreeLoopbackPort();
  log_path_ = ::testing::TempDir() + "/tandemd_" + std::to_string(::getpid()) + "_" +
              std::to_string(port_) + ".log";
  std::vector<std::string> args = {binary, "--listen=" + address(),
                                   "--metrics_listen=127.0.0.1:" + std::to_string(metrics_port_),
                                   "--http_port=" + std::to_string(http_port_),
                                   // One timed round of the start-up measurement
                                   // (five by default): tests start daemons by the
                                   // hundred and need its figures, not precise
                                   // ones. `extra` comes after: a test that
                                   // compares measured figures sets it back.
                                   "--startup_measure_rounds=1",
                                   // The exact mode, unless `extra` names one:
                                   // auto's choice comes from a start-up timing
                                   // that a busy machine can move, and the tests
                                   // compare daemons' tokens (two daemons of one
                                   // test rounding differently would not even
                                   // hand requests to each other).
                                   "--cpu_matmul=f32"};
  bool has_model = false, sets_threads = false;
  for (const std::string& e : extra) {
    has_model |= e.rfind("--model=", 0) == 0;
    sets_threads |= e.rfind("--threads", 0) == 0 || e.rfind("--decode_reserved_threads", 0) == 0;
  }
  if (!has_model) args.push_back("--model=" + model);
  // The CPUs per ctest job (TestComputeThreads), unless the test sizes the
  // pool itself; run alone, the daemon's default (every CPU). Unpinned:
  // side by side, every daemon would pin its helper t to the same CPU t.
  if (const int threads = TestComputeThreads(0); threads > 0 && !sets_threads) {
    args.push_back("--threads=" + std::to_string(threads));
    args.push_back("--pin_threads=false");
  }
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ == 0) {
    // The daemon dies with the test (even one that aborts before its
    // destructors run), so no daemon outlives its test. The kernel sends the
    // signal when the creating *thread* ends: tests create daemons on their
    // main thread. Only async-signal-safe calls between fork and exec.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int log = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log < 0 || ::dup2(log, 2) < 0 || ::dup2(2, 1) < 0) ::_exit(127);
    ::execve(argv[0], argv.data(), environ);
    ::_exit(127);
  }
}

Daemon::~Daemon() {
  if (pid_ > 0 && !exit_code_.has_value()) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

std::string Daemon::Log() const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::unique_ptr<v1::Generation::Stub> Daemon::Stub() const {
  return v1::Generation::NewStub(
      grpc::CreateChannel(address(), grpc::InsecureChannelCredentials()));
}

std::string Daemon::Health() {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return "error " + std::to_string(status.error_code());
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

bool Daemon::WaitServing(std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return false;
    }
    if (Health() == "SERVING") return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

bool Daemon::WaitForLoad(const std::function<bool(const v1::Load&)>& done,
                         std::chrono::seconds timeout) {
  auto stub = Stub();
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::Load load;
    if (stub->GetLoad(&context, v1::GetLoadRequest(), &load).ok() && done(load)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

bool Daemon::WaitForHealth(const std::string& status, std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (Health() == status) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

int Daemon::WaitExit(std::chrono::seconds timeout) {
  if (exit_code_.has_value()) return *exit_code_;
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return *exit_code_;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

int Daemon::Stop(int signal, std::chrono::seconds timeout) {
  if (!exit_code_.has_value()) ::kill(pid_, signal);
  return WaitExit(timeout);
}

Generation Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                    std::chrono::milliseconds timeout) {
  Generation g;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    g.text += response.text();
    g.token_ids.insert(g.token_ids.end(), response.token_ids().begin(), response.token_ids().end());
    g.messages.push_back(response);
  }
  g.status = reader->Finish();
  if (!g.messages.empty()) g.last = g.messages.back();
  return g;
}

void ExpectStartupErrors(const std::vector<StartupErrorCase>& cases) {
  for (const StartupErrorCase& c : cases) {
    Daemon daemon(c.flags);
    EXPECT_EQ(daemon.WaitExit(std::chrono::seconds(60)), c.exit_code) << c.flags.back();
    const std::string log = daemon.Log();
    EXPECT_NE(log.find(c.message), std::string::npos) << c.message << "\nnot in:\n" << log;
  }
}

v1::GenerateRequest Chat(const std::string& user_message, std::optional<float> temperature,
                         int max_tokens) {
  v1::GenerateRequest r;
  auto* m = r.add_messages();
  m->set_role("user");
  m->set_content(user_message);
  if (temperature.has_value()) r.mutable_sampling()->set_temperature(*temperature);
  r.set_max_tokens(max_tokens);
  return r;
}

v1::GenerateRequest Tokens(int count, int salt, int max_tokens) {
  v1::GenerateRequest r;
  for (int t = 0; t < count; ++t) {
    r.add_token_ids(static_cast<uint32_t>(500 + (t * 7919 + salt * 104729) % 40000));
  }
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0.0f);
  return r;
}

}  // namespace tandem::testing
