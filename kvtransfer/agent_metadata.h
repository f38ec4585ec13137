// The metadata blob an agent publishes (TransferAgent::LocalMetadata): what a
// peer needs to connect to it and to read its regions. Transport-neutral
// framing around transport-specific bytes (UCX: the worker address; a
// region's key is empty, since reads go through grants). Decoding checks every length, so a corrupt
// or hostile blob is an INVALID_ARGUMENT, never a read out of bounds.
#ifndef TANDEM_KVTRANSFER_AGENT_METADATA_H_
#define TANDEM_KVTRANSFER_AGENT_METADATA_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::kvtransfer {

struct RegionMetadata {
  uint64_t base = 0;   // the region's address in its owner's memory
  uint64_t bytes = 0;  // its length
  std::string key;     // the transport's access key for it

  friend bool operator==(const RegionMetadata&, const RegionMetadata&) = default;
};

struct AgentMetadata {
  std::string backend;  // which transport made it ("ucx"); a peer must match
  std::string address;  // the transport's address of the agent
  std::vector<RegionMetadata> regions;

  friend bool operator==(const AgentMetadata&, const AgentMetadata&) = default;
};

std::string EncodeAgentMetadata(const AgentMetadata& metadata);
absl::StatusOr<AgentMetadata> DecodeAgentMetadata(std::string_view bytes);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_AGENT_METADATA_H_
