// A TransferAgent over UCX (Debian's libucx, 1.13), over whatever transports
// UCX picks (TCP here; RDMA where the hardware has it). Reads are active
// messages, not UCX's one-sided gets: the reader asks for a transfer's
// ranges chunk by chunk with the owner's grant token, and the owner's agent
// answers only what a live grant covers (ucx_agent.cc says why). Each agent
// has one UCX context and worker, and a progress thread that answers peers'
// reads and completes this agent's own transfers. Host memory only.
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
