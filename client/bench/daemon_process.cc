#include "client/bench/daemon_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/shape.h"
#include "common/free_port.h"

namespace tandem::bench {

absl::Status DaemonProcess::Start(const std::string& tandemd, const std::string& model,
                                  const std::vector<std::string>& flags,
                                  const std::string& log_path, double timeout_s) {
  port_ = FreeLoopbackPort();
  metrics_port_ = FreeLoopbackPort();
  http_port_ = FreeLoopbackPort();
  std::vector<std::string> args = {tandemd, "--model=" + model,
                                   absl::StrCat("--listen=127.0.0.1:", port_),
                                   absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port_),
                                   absl::StrCat("--http_port=", http_port_)};
  args.insert(args.end(), flags.begin(), flags.end());
  pid_ = ::fork();
  if (pid_ < 0) return absl::InternalError("fork failed");
  if (pid_ == 0) {
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log >= 0) {
      ::dup2(log, STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(
          absl::StrCat(tandemd, " exited during start-up (see ", log_path, ")"));
    }
    // The exposer starts once the model is loaded.
    absl::StatusOr<std::string> page = client::HttpGet(metrics_url());
    if (page.ok() && page->find("tandem_start_time_seconds") != std::string::npos) {
      return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  Stop();
  return absl::DeadlineExceededError(
      absl::StrCat(tandemd, " did not start within ", timeout_s, " s (see ", log_path, ")"));
}

void DaemonProcess::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 300; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace tandem::bench
