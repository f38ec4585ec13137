// Builds and starts the gRPC server: listening address, optional TLS (and
// mTLS), API keys checked for every call, keepalive and message-size limits suited to a load
// balancer in front, health checking and reflection.
#ifndef TANDEM_SERVER_GRPC_SERVER_H_
#define TANDEM_SERVER_GRPC_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/grpc_server_options.h"

namespace tandem::server {

// Starts the server with `service` registered (plus health and reflection).
// Errors name the file or address that is wrong.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const GrpcServerOptions& options, const std::vector<grpc::Service*>& services);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_GRPC_SERVER_H_
