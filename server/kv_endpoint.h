// This daemon's end of the KV transport between daemons: a transfer agent
// (kvtransfer/) with the paged KV storage registered, and what a peer needs
// to read it. A prefill daemon publishes it in its handoffs; a decode daemon
// reads from its peers' with it.
#ifndef TANDEM_SERVER_KV_ENDPOINT_H_
#define TANDEM_SERVER_KV_ENDPOINT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/kernels/backend.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::server {

struct KvEndpoint {
  std::unique_ptr<kvtransfer::TransferAgent> agent;
  uint32_t region = 0;          // the KV storage's region in `agent`
  kernels::KvCacheShape shape;  // its layout (blocks included)
  std::string metadata;         // agent->LocalMetadata()
  // The backend's arithmetic() (kernels/backend.h): a handoff's pages are
  // decoded from only by a daemon whose products round the same way.
  std::string arithmetic;
};

// What to do about two daemons whose arithmetic differs, as both sides of a
// refused handoff say it (the prefill daemon's log, the decode daemon's
// error).
inline constexpr char kSameArithmeticAdvice[] =
    "give both daemons the same --cpu_matmul (not auto, where their CPUs differ), --device and "
    "version";

// Starts a UCX agent on `transports` ("tcp", ...), listening for peers on
// a port of `tcp_ports` ("LOW-HIGH"; empty: any), and registers `backend`'s
// KV storage (host or device memory) in it.
absl::StatusOr<KvEndpoint> StartKvEndpoint(const kernels::Backend& backend,
                                           const std::string& transports,
                                           const std::string& tcp_ports = "");

}  // namespace tandem::server

#endif  // TANDEM_SERVER_KV_ENDPOINT_H_
