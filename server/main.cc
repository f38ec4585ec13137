// tandemd: the Tandem serving daemon.
//
// Start-up: read and check every flag (server/daemon_options.h), then
// assemble the daemon (server/daemon.h): load and warm up the model, start
// the scheduler, the gRPC server (Generation, health, reflection) and the
// metrics exposer, report SERVING. SIGTERM/SIGINT: report NOT_SERVING, stop
// accepting, let in-flight requests finish for up to --drain_timeout, cancel
// the rest, exit 0. Exit 2: a flag's value is wrong; 1: start-up failed.
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/synchronization/notification.h"
#include "engine/kernels/cuda/cuda_loader.h"
#include "server/daemon.h"
#include "server/daemon_options.h"
#include "server/logging.h"
#include "spdlog/spdlog.h"

namespace tandem {
namespace {

// Waits for SIGTERM or SIGINT on a dedicated thread (the signals are blocked
// everywhere else), so shutdown runs as ordinary code, not in a handler.
std::thread StartSignalThread(absl::Notification* shutdown) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return std::thread([signals, shutdown] {
    int signal = 0;
    sigwait(&signals, &signal);
    spdlog::info("received {}, draining", signal == SIGTERM ? "SIGTERM" : "SIGINT");
    shutdown->Notify();
  });
}

int Main() {
  absl::Notification shutdown;
  StartSignalThread(&shutdown).detach();

  absl::StatusOr<server::DaemonOptions> options = server::DaemonOptionsFromFlags(
      kernels::cuda::ProbeCudaModule(kernels::cuda::DefaultCudaModulePath()));
  if (!options.ok()) {
    spdlog::error("{}", std::string(options.status().message()));
    return 2;
  }
  absl::StatusOr<std::unique_ptr<server::Daemon>> daemon = server::Daemon::Start(*options);
  if (!daemon.ok()) {
    spdlog::error("{}", std::string(daemon.status().message()));
    return server::StartupExitCode(daemon.status());
  }
  (*daemon)->ServeUntil(shutdown);
  (*daemon)->Drain();
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the Tandem LLM inference serving daemon (docs/operations.md). Flags:");
  // --help lists the daemon's flags (Abseil's default matches only a file
  // named after the binary).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::string_view(file).find("server/") != absl::string_view::npos;
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  // Logs go to stderr (stdout stays free for tools that wrap the daemon).
  if (absl::Status s = tandem::server::ConfigureLogging(tandem::server::LogFormatFlag()); !s.ok()) {
    std::fprintf(stderr, "tandemd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  return tandem::Main();
}
