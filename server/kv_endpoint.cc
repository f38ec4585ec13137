#include "server/kv_endpoint.h"

#include "common/strings.h"
#include "kvtransfer/ucx_agent.h"

namespace tandem::server {

absl::StatusOr<KvEndpoint> StartKvEndpoint(const kernels::Backend& backend,
                                           const std::string& transports,
                                           const std::string& tcp_ports) {
  KvEndpoint endpoint;
  absl::StatusOr<std::unique_ptr<kvtransfer::TransferAgent>> agent =
      kvtransfer::CreateUcxAgent({.transports = transports, .tcp_ports = tcp_ports});
  if (!agent.ok()) {
    return absl::Status(agent.status().code(),
                        StrCat("--kv_transport=", transports,
                               tcp_ports.empty() ? "" : StrCat(" --kv_transport_ports=", tcp_ports),
                               ": ", agent.status().message()));
  }
  endpoint.agent = *std::move(agent);
  const kernels::KvStorage storage = backend.kv_storage();
  if (storage.data == nullptr) return absl::FailedPreconditionError("the KV cache has no storage");
  absl::StatusOr<uint32_t> region = endpoint.agent->RegisterMemory(
      storage.data, storage.bytes,
      storage.device ? kvtransfer::MemoryKind::kCuda : kvtransfer::MemoryKind::kHost);
  if (!region.ok()) return region.status();
  endpoint.region = *region;
  endpoint.shape = backend.kv_cache_shape();
  absl::StatusOr<std::string> metadata = endpoint.agent->LocalMetadata();
  if (!metadata.ok()) return metadata.status();
  endpoint.metadata = *std::move(metadata);
  endpoint.arithmetic = backend.arithmetic();
  return endpoint;
}

}  // namespace tandem::server
