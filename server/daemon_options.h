// Everything tandemd is told on its command line, read in one place and
// checked there before anything starts, as far as a value can be judged
// without the model file or the network: what depends on the model (the
// n-gram lengths, --draft_layers against its layer count, --draft_model,
// --chat_template, the KV cache holding a full context) is checked when it
// loads, and the listen address and TLS files when the gRPC server starts.
// A daemon is then assembled from the options (server/daemon.h), so a new
// front end, role or policy adds a field here and a few lines there.
//
// The flags themselves (ABSL_FLAG) are defined in daemon_options.cc; only
// DaemonOptionsFromFlags reads them.
#ifndef TANDEM_SERVER_DAEMON_OPTIONS_H_
#define TANDEM_SERVER_DAEMON_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/kernels/backend_factory.h"
#include "engine/kernels/cuda/cuda_loader.h"
#include "scheduler/fault_injection.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/step_dispatcher.h"
#include "server/grpc_server_options.h"
#include "server/http_server.h"
#include "server/request_builder.h"
#include "server/serving_model.h"

namespace tandem::server {

// What this daemon does in a pool of daemons (--role).
enum class Role {
  kUnified,  // prefill and decode here
  kPrefill,  // hands requests that reach the threshold to decode daemons
  kDecode,   // takes requests over from prefill daemons; no prompts from clients
};
std::string_view RoleName(Role role);

// How the daemon listens and whom it lets in.
struct ListenOptions {
  // --listen, TLS, message and stream limits, API keys (read from
  // --api_keys_file at start-up; null: every call is let in).
  // grpc.on_unauthenticated is the daemon's to set.
  GrpcServerOptions grpc;
  std::string metrics;  // --metrics_listen; empty: no metrics endpoint
  std::string api_keys_file;
  // The OpenAI-compatible HTTP API (--http_port, on --listen's host, with
  // its TLS files; the write timeout is --slow_reader_timeout's).
  bool http_enabled = true;
  HttpServerOptions http;
  std::string served_model_name;  // empty: the model file's name
};

// The host part of a host:port listen address, as an IP address the HTTP
// server can bind ("localhost" is 127.0.0.1; brackets of IPv6 removed).
std::string ListenHost(std::string_view listen);

// What the front end applies to every request.
struct RequestPolicy {
  RequestDefaults defaults;                                // --max_tokens_default, --default_*
  int32_t max_prompt_tokens = 0;                           // 0: the context length minus one
  absl::Duration default_deadline = absl::Minutes(10);     // zero: none
  absl::Duration slow_reader_timeout = absl::Seconds(60);  // zero: never
};

// Prefill and decode daemons (--role other than unified).
struct PoolOptions {
  std::vector<std::string> decode_peers;  // --role=prefill: host:port each
  std::string kv_transport = "tcp";       // UCX transports, as UCX_TLS takes them
  // The KV transport's TCP listening ports, "LOW-HIGH" (empty: any).
  std::string kv_transport_ports;
  // --role=decode: the Peer service's own port (empty: on --listen).
  std::string peer_listen;
  // Mutual TLS between prefill and decode daemons: this daemon's
  // certificate and key, and the CA its peers' certificates must chain to
  // (files; all three or none).
  std::string peer_tls_cert;
  std::string peer_tls_key;
  std::string peer_tls_ca;
  absl::Duration peer_load_interval = absl::Milliseconds(200);
};

// KV events for cache-aware routers (server/kv_event_publisher.h).
struct KvEventsOptions {
  std::string endpoint;         // --kv_events_endpoint; empty: off
  std::string replay_endpoint;  // --kv_events_replay_endpoint; empty: none
  std::string topic;            // --kv_events_topic; empty: kv@<listen>@<served model>
  int32_t replay_messages = 10000;
};

struct DaemonOptions {
  Role role = Role::kUnified;
  kernels::DeviceChoice device;  // what --device resolved to, and why
  // The model and its workers. model.decode_worker is set from the role and
  // the policy: a local decode worker exists only on a unified daemon, under
  // --policy=slo or a threshold that is not off.
  ServingModelOptions model;
  // --policy=threshold: --disagg_output_threshold, a token count, nullopt
  // for off, or (when auto_threshold) measured at start-up. --policy=slo
  // (scheduler.slo_policy): no threshold; paths by predicted headroom.
  std::optional<int32_t> output_threshold;
  bool auto_threshold = false;
  // The scheduler's settings that come from flags; those that come from the
  // loaded model (block counts, context length, step costs) and the
  // threshold are filled in at start-up.
  scheduler::SchedulerOptions scheduler;
  int max_queued_requests = 256;
  // How each lane's next step is chosen (scheduler/step_dispatcher.h): the
  // policy, the fixed pacing of --policy=threshold, and whether the lanes
  // share the compute (not with --decode_reserved_threads).
  scheduler::DispatchOptions dispatch;
  // --admission=slo: refuse a request whose predicted TTFT passes its budget.
  bool admission_by_slo = false;
  // --release_sliding_kv: give back sliding-window layers' pages a window
  // behind (docs/architecture.md, "Sliding-window layers' pages").
  bool release_sliding_kv = true;
  std::string speculative = "ngram";  // off, ngram, suffix or draft, as given
  RequestPolicy requests;
  ListenOptions listen;
  PoolOptions pool;
  KvEventsOptions kv_events;
  std::optional<scheduler::FaultSpec> fault;  // --inject_fault (testing only)
  absl::Duration drain_timeout = absl::Seconds(30);
  absl::Duration stall_timeout = absl::Seconds(60);
};

// Reads every flag of tandemd and checks those it can judge (above):
// INVALID_ARGUMENT whose message names the flag and its value on the first
// that is wrong. `cuda` is what
// probing the CUDA module found (kernels::cuda::ProbeCudaModule), which
// --device is resolved against. Reads --api_keys_file.
absl::StatusOr<DaemonOptions> DaemonOptionsFromFlags(
    const absl::StatusOr<kernels::cuda::CudaProbe>& cuda);

// --log_format, read before everything else so that errors are logged in
// the format asked for.
std::string LogFormatFlag();

}  // namespace tandem::server

#endif  // TANDEM_SERVER_DAEMON_OPTIONS_H_
