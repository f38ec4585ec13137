// A tandemd child process for `tandem bench --sweep-threshold`, which
// measures several daemon configurations on this machine.
#ifndef TANDEM_CLIENT_BENCH_DAEMON_PROCESS_H_
#define TANDEM_CLIENT_BENCH_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem::bench {

class DaemonProcess {
 public:
  // Starts `tandemd --model=MODEL --listen=127.0.0.1:P --metrics_listen=...
  // FLAGS` on free ports, its log in `log_path`; waits (up to `timeout_s`)
  // until its metrics page answers (the model is loaded then; the gRPC
  // server follows a moment later, so callers still wait for an RPC).
  absl::Status Start(const std::string& tandemd, const std::string& model,
                     const std::vector<std::string>& flags, const std::string& log_path,
                     double timeout_s = 120);
  // SIGTERM, then waits for the exit (SIGKILL after 30 s).
  void Stop();
  ~DaemonProcess() { Stop(); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string metrics_url() const {
    return "http://127.0.0.1:" + std::to_string(metrics_port_) + "/metrics";
  }
  // The OpenAI-compatible HTTP API.
  std::string http_address() const { return "127.0.0.1:" + std::to_string(http_port_); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
  int http_port_ = 0;
};

}  // namespace tandem::bench

#endif  // TANDEM_CLIENT_BENCH_DAEMON_PROCESS_H_
