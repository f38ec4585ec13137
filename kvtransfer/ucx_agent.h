// A TransferAgent over UCX (Debian's libucx, 1.13): RMA gets over whatever
// transports UCX picks (TCP and shared memory here; RDMA and CUDA memory
// where the hardware and UCX's build have them), notifications as UCX active
// messages. One UCX context and worker per agent; a progress thread answers
// peers' reads (needed where the transport has no remote memory access, TCP)
// and completes this agent's own transfers.
#ifndef TANDEM_KVTRANSFER_UCX_AGENT_H_
#define TANDEM_KVTRANSFER_UCX_AGENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::kvtransfer {

struct UcxAgentOptions {
  // UCX transports, as UCX_TLS takes them ("tcp", "shm,tcp", "rc,cuda_copy");
  // empty: UCX's own choice (the UCX_TLS environment variable, else all).
  std::string transports;
  // The TCP ports the agent listens on for its peers, "LOW-HIGH" (UCX's
  // UCX_TCP_PORT_RANGE: one is drawn from it); empty: any the system gives.
  // What lets a firewall or NetworkPolicy open the transport by port. UCX
  // only warns about a malformed range: check it first (the daemon's flag
  // does).
  std::string tcp_ports;
};

// Starts an agent; UNAVAILABLE, with UCX's reason, when UCX cannot start
// (no usable transport among `transports`).
absl::StatusOr<std::unique_ptr<TransferAgent>> CreateUcxAgent(const UcxAgentOptions& options);

// The largest notification PostRead accepts, in bytes (sent inline).
inline constexpr size_t kMaxNotificationBytes = 1024;

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_UCX_AGENT_H_
