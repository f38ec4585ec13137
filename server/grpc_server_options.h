// How the gRPC server listens and whom it lets in (server/grpc_server.h
// starts it). No gRPC header here: the daemon's options hold this.
#ifndef TANDEM_SERVER_GRPC_SERVER_OPTIONS_H_
#define TANDEM_SERVER_GRPC_SERVER_OPTIONS_H_

#include <functional>
#include <memory>
#include <string>

#include "server/api_keys.h"

namespace tandem::server {

struct GrpcServerOptions {
  std::string listen;         // host:port
  std::string tls_cert_file;  // PEM; with tls_key_file enables TLS
  std::string tls_key_file;   // PEM
  std::string tls_client_ca;  // PEM; when set, clients must present a certificate it signed
  // The flags the three files came from, for error messages.
  std::string tls_cert_flag = "--tls_cert";
  std::string tls_key_flag = "--tls_key";
  std::string tls_client_ca_flag = "--tls_client_ca";
  int max_message_bytes = 64 << 20;
  int max_concurrent_streams = 100;  // per client connection (HTTP/2 SETTINGS)
  // When set, every call but health checks needs one of these keys
  // (server/grpc_auth.h); `on_unauthenticated` runs for each refused call.
  std::shared_ptr<const ApiKeys> api_keys;
  std::function<void()> on_unauthenticated;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_GRPC_SERVER_OPTIONS_H_
