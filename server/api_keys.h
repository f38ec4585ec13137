// API-key checking, without gRPC: the rule grpc_auth.h applies to every call
// in gRPC's transport, before any service code runs.
#ifndef TANDEM_SERVER_API_KEYS_H_
#define TANDEM_SERVER_API_KEYS_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::server {

class ApiKeys {
 public:
  // `keys`: the accepted bearer tokens (not empty).
  explicit ApiKeys(std::vector<std::string> keys) : keys_(std::move(keys)) {}

  // Whether the call to `method_path` ("/package.Service/Method") may
  // proceed given its `authorization` metadata (nullopt: none). Health
  // checks need no key (load balancers and Kubernetes probes send none);
  // every other method, present or future, does. UNAUTHENTICATED names
  // what is wrong, never the key. Compares in time that depends only on the
  // lengths, so a key cannot be guessed byte by byte from response times.
  absl::Status Check(std::string_view method_path,
                     std::optional<std::string_view> authorization) const;

  size_t size() const { return keys_.size(); }
  // The key this daemon presents to its own peers (a pool shares one key
  // file): the first.
  const std::string& first() const { return keys_.front(); }

 private:
  std::vector<std::string> keys_;
};

// Reads an API keys file (--api_keys_file): one key per line; blank lines
// and lines starting with '#' are ignored. Errors for an unreadable or empty
// file name the flag.
absl::StatusOr<std::vector<std::string>> ReadApiKeys(const std::string& path);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_API_KEYS_H_
