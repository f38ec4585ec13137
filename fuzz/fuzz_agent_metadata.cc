// The KV-transfer metadata decoder on arbitrary bytes (a peer's blob arrives
// over the network): DecodeAgentMetadata must accept or refuse with a
// status, never crash or read past the input; what it accepts must encode
// back to exactly the input (the framing has one spelling per value).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kvtransfer/agent_metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto metadata = tandem::kvtransfer::DecodeAgentMetadata(bytes);
  if (metadata.ok() && tandem::kvtransfer::EncodeAgentMetadata(*metadata) != bytes) std::abort();
  return 0;
}
