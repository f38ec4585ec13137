// Builds and starts the gRPC server: listening address, optional TLS (and
// mTLS), API keys checked for every call, keepalive and message-size limits suited to a load
// balancer in front, health checking and reflection.
#ifndef TANDEM_SERVER_GRPC_SERVER_H_
#define TANDEM_SERVER_GRPC_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/api_keys.h"

namespace tandem::server {

struct GrpcServerOptions {
  std::string listen;         // host:port
  std::string tls_cert_file;  // PEM; with tls_key_file enables TLS
  std::string tls_key_file;   // PEM
  std::string tls_client_ca;  // PEM; when set, clients must present a certificate it signed
  int max_message_bytes = 64 << 20;
  int max_concurrent_streams = 100;  // per client connection (HTTP/2 SETTINGS)
  // When set, every call but health checks needs one of these keys
  // (server/grpc_auth.h); `on_unauthenticated` runs for each refused call.
  std::shared_ptr<const ApiKeys> api_keys;
  std::function<void()> on_unauthenticated;
};

// Starts the server with `service` registered (plus health and reflection).
// Errors name the file or address that is wrong.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const GrpcServerOptions& options, const std::vector<grpc::Service*>& services);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_GRPC_SERVER_H_
