// tandemd assembled from its DaemonOptions: the model and its workers, the
// scheduler, the metrics endpoint, the gRPC server, and the links of a
// prefill or decode daemon. main.cc reads the options, starts a Daemon,
// serves until a signal and drains it.
//
// No gRPC header here: the parts that need one live behind `Parts` in
// daemon.cc.
#ifndef TANDEM_SERVER_DAEMON_H_
#define TANDEM_SERVER_DAEMON_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "server/daemon_options.h"

namespace tandem::server {

class Daemon {
 public:
  // Loads and warms up the model, starts the scheduler, the metrics endpoint
  // and the gRPC server (and the peer links of a prefill or decode daemon).
  // Health reports SERVING when it returns. Errors say what failed; see
  // StartupExitCode for how tandemd reports them.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Serves until `shutdown` is notified. Meanwhile health turns NOT_SERVING
  // while the scheduler stalls (work pending, no step completed for
  // --stall_timeout) and SERVING again once it makes progress.
  void ServeUntil(absl::Notification& shutdown);

  // Refuses new work (UNAVAILABLE, so callers retry elsewhere), lets the
  // calls in flight finish for up to --drain_timeout, cancels the rest with
  // UNAVAILABLE, then stops the scheduler and the gRPC server. No call is
  // dropped without a status.
  void Drain();

 private:
  struct Parts;
  explicit Daemon(std::unique_ptr<Parts> parts);
  std::unique_ptr<Parts> parts_;
};

// The exit code for a failed Daemon::Start: 2 when a flag's value proved
// unusable only on trying it (INVALID_ARGUMENT: the listen address, the TLS
// files, as for the values DaemonOptionsFromFlags refuses), 1 when start-up
// failed otherwise (the model, the KV transport, the metrics endpoint).
int StartupExitCode(const absl::Status& status);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_DAEMON_H_
