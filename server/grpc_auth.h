// Server credentials that check API keys once for every call, in gRPC's
// transport (an auth metadata processor), so that no RPC, present or
// future, runs without the check. Works with and without TLS.
#ifndef TANDEM_SERVER_GRPC_AUTH_H_
#define TANDEM_SERVER_GRPC_AUTH_H_

#include <grpc/grpc_security.h>
#include <grpcpp/security/server_credentials.h>

#include <functional>
#include <memory>

#include "server/api_keys.h"

namespace tandem::server {

// Takes ownership of `core` (insecure or TLS server credentials from gRPC's
// C API). With `keys`, every call is checked by ApiKeys::Check before it
// reaches a service; a refused call ends UNAUTHENTICATED and `on_refused`
// runs (metrics). Without keys, the credentials are `core` unchanged.
std::shared_ptr<grpc::ServerCredentials> CoreServerCredentials(grpc_server_credentials* core,
                                                               std::shared_ptr<const ApiKeys> keys,
                                                               std::function<void()> on_refused);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_GRPC_AUTH_H_
