#include "server/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <optional>

#include "common/strings.h"
#include "server/flag_file.h"
#include "server/grpc_auth.h"

namespace tandem::server {

absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const GrpcServerOptions& options, const std::vector<grpc::Service*>& services) {
  grpc_server_credentials* core = nullptr;
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
      return absl::InvalidArgumentError(
          StrCat(options.tls_cert_flag, " and ", options.tls_key_flag, " go together"));
    }
    absl::StatusOr<std::string> cert = ReadFlagFile(options.tls_cert_file, options.tls_cert_flag);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFlagFile(options.tls_key_file, options.tls_key_flag);
    if (!key.ok()) return key.status();
    std::optional<std::string> ca;
    if (!options.tls_client_ca.empty()) {
      absl::StatusOr<std::string> read =
          ReadFlagFile(options.tls_client_ca, options.tls_client_ca_flag);
      if (!read.ok()) return read.status();
      ca = *std::move(read);
    }
    grpc_ssl_pem_key_cert_pair pair = {key->c_str(), cert->c_str()};
    core = grpc_ssl_server_credentials_create_ex(
        ca.has_value() ? ca->c_str() : nullptr, &pair, 1,
        ca.has_value() ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                       : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        nullptr);
  } else if (!options.tls_client_ca.empty()) {
    return absl::InvalidArgumentError(StrCat(options.tls_client_ca_flag, " needs ",
                                             options.tls_cert_flag, " and ", options.tls_key_flag));
  } else {
    core = grpc_insecure_server_credentials_create();
  }
  std::shared_ptr<grpc::ServerCredentials> credentials =
      CoreServerCredentials(core, options.api_keys, options.on_unauthenticated);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(options.listen, credentials, &bound_port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  // Keepalive that load balancers and long idle client channels survive:
  // ping idle connections every 30 s, drop them when a ping goes unanswered
  // for 10 s, and accept client pings as often as every 10 s.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    return absl::UnavailableError(StrCat("cannot listen on ", options.listen));
  }
  return server;
}

}  // namespace tandem::server
