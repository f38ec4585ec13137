#include "server/daemon.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/strings.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "scheduler/fault_injection.h"
#include "scheduler/scheduler.h"
#include "scheduler/slo_path.h"
#include "server/flag_file.h"
#include "server/generation_frontend.h"
#include "server/generation_service.h"
#include "server/grpc_server.h"
#include "server/http_server.h"
#include "server/kv_endpoint.h"
#include "server/kv_event_publisher.h"
#include "server/lane_kv_mover.h"
#include "server/openai_service.h"
#include "server/peer_service.h"
#include "server/remote_decoder.h"
#include "server/scheduler_collector.h"
#include "server/server_metrics.h"
#include "server/serving_model.h"
#include "spdlog/spdlog.h"

namespace tandem::server {

// Everything a running daemon holds, in the order it is built: members are
// destroyed in reverse. The scheduler calls into parts built after it (the
// lane mover, the remote decoder) from its threads, so it is stopped before
// any member goes, on every path (a drain stops it first anyway; a Start that
// fails half way does not).
struct Daemon::Parts {
  ~Parts() {
    if (scheduler != nullptr) scheduler->Stop();
  }

  DaemonOptions options;
  // Declared before (so destroyed after) the KV endpoint and the lane mover:
  // at shutdown the scheduler frees the blocks of transfers still landing
  // (SchedulerCore::AbandonTransfers), which may write into the KV storage
  // the model owns until those two are gone.
  std::unique_ptr<ServingModel> model;
  std::unique_ptr<scheduler::FaultInjectingWorker> faulty;  // --inject_fault
  std::shared_ptr<prometheus::Registry> registry;
  std::unique_ptr<ServerMetrics> metrics;
  std::unique_ptr<KvEventPublisher> kv_events;  // --kv_events_endpoint
  std::unique_ptr<scheduler::Scheduler> scheduler;
  std::unique_ptr<LaneKvMover> lane_mover;       // a decode worker with KV of its own
  std::unique_ptr<KvEndpoint> kv_endpoint;       // a prefill or decode daemon
  std::unique_ptr<GenerationFrontend> frontend;  // what gRPC and HTTP share
  std::unique_ptr<GenerationService> service;
  std::unique_ptr<OpenAiService> openai;
  std::unique_ptr<PeerService> peer_service;  // a decode daemon
  std::shared_ptr<SchedulerCollector> scheduler_collector;
  std::unique_ptr<prometheus::Exposer> exposer;
  std::unique_ptr<grpc::Server> grpc_server;
  std::unique_ptr<grpc::Server> peer_server;      // --peer_listen
  std::unique_ptr<HttpServer> http_server;        // --http_port
  std::unique_ptr<RemoteDecoder> remote_decoder;  // a prefill daemon
};

namespace {

// A start-up failure that is not a flag's value (tandemd exits 1).
absl::Status Failed(std::string message) { return absl::UnavailableError(std::move(message)); }

// Runs one token through the workers so that weights are paged in and
// buffers allocated before the first request.
absl::Status WarmUp(ServingModel& model) {
  step::StepPlan plan;
  step::SequenceStep step;
  step.sequence_id = 0;
  step.tokens = {0};
  step.block_table = {0};
  step.sample = true;
  plan.sequences.push_back(step);
  if (absl::Status s = model.prefill_worker()->Execute(plan).status; !s.ok()) return s;
  if (model.decode_worker() == nullptr) return absl::OkStatus();
  return model.decode_worker()->Execute(plan).status;
}

// Sliding-window layers (Gemma 2 and 3): their pages of blocks a whole
// window behind every sequence that holds them go back to the system, so
// the KV cache's resident size at long contexts follows the full-attention
// layers. Not where a KV transport registers the storage (a prefill or
// decode daemon, a decode worker with pages of its own): it could go on
// reading the pages that were given back.
void EnableSlidingRelease(ServingModel& model, const DaemonOptions& options,
                          scheduler::SchedulerOptions& sched) {
  const model::ModelConfig& config = model.config();
  if (!config.HasSlidingLayers()) return;
  const auto sliding = std::count(config.sliding_layers.begin(), config.sliding_layers.end(), true);
  const char* kept_because = !options.release_sliding_kv ? "--release_sliding_kv=false"
                             : !model.kv_backend().MemoryIsHost()
                                 ? "device memory is not given back page by page"
                             : options.role != Role::kUnified || model.decode_kv_blocks() > 0
                                 ? "a KV transport has the storage registered"
                                 : nullptr;
  if (kept_because != nullptr) {
    spdlog::info("sliding-window layers ({} of {}, window {}): all their KV pages are kept ({})",
                 sliding, config.layers, config.sliding_window, kept_because);
    return;
  }
  sched.sliding_window = config.sliding_window;
  sched.release_sliding_pages = [&model](scheduler::Lane, std::span<const int32_t> blocks) {
    model.ReleaseSlidingKvPages(blocks);
  };
  spdlog::info(
      "sliding-window layers ({} of {}, window {}): their KV pages a window behind a "
      "sequence are given back",
      sliding, config.layers, config.sliding_window);
}

absl::StatusOr<std::unique_ptr<ServingModel>> LoadModel(const DaemonOptions& options) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<ServingModel>> model = ServingModel::Load(options.model);
  if (!model.ok()) return Failed(StrCat("cannot load the model: ", model.status().ToString()));
  if (absl::Status s = WarmUp(**model); !s.ok()) {
    return Failed(StrCat("warm-up failed: ", s.ToString()));
  }
  const model::ModelConfig& config = (*model)->config();
  spdlog::info(
      "model '{}' ({}, {} layers, vocab {}, context {}) on {}; chat template {}; {} KV blocks of "
      "{} tokens ({} MiB); ready in {:.2f}s",
      config.name, config.architecture, config.layers, config.vocab, (*model)->context_length(),
      (*model)->backend_name(), (*model)->chat_template().family_name(), (*model)->kv_blocks(),
      (*model)->block_size(), options.model.kv_cache_bytes >> 20,
      absl::ToDoubleSeconds(absl::Now() - start));
  if (!options.model.matmul_mode_reason.empty()) {
    spdlog::info("--cpu_matmul=auto: {} products on the CPU: {}",
                 kernels::cpu::MatMulModeName(options.model.matmul_mode),
                 options.model.matmul_mode_reason);
  }
  for (const std::string& warning : (*model)->warnings()) spdlog::warn("{}", warning);
  return model;
}

// The scheduler's options: the flags' part completed with what the model
// measured and holds.
scheduler::SchedulerOptions SchedulerOptionsFor(const DaemonOptions& options,
                                                const ServingModel& model) {
  scheduler::SchedulerOptions sched = options.scheduler;
  sched.block_size = model.block_size();
  sched.kv_blocks = model.kv_blocks();
  sched.decode_kv_blocks = model.decode_kv_blocks();
  // Reserved decode threads: the lanes share no compute.
  sched.lanes_share_compute = options.dispatch.shared_compute;
  sched.context_length = model.context_length();
  const StepCosts& costs = model.step_costs();
  sched.speculation.draft_cost = costs.draft;
  sched.step_time_prior = costs.linear;
  sched.row_curve = costs.rows;
  sched.on_finished_text = model.SuffixCacheFeed();
  const scheduler::DraftModelCost& d = costs.draft;
  const ServingModelOptions& m = options.model;
  spdlog::info(
      "speculative decoding: {} (up to {} drafted tokens, {}); the backend's row curve (rows: "
      "effective rows) {}{}{}",
      options.speculative, sched.speculation.max_draft,
      sched.speculation.adaptive ? "adaptive" : "fixed", costs.rows.Describe(),
      m.draft_layers > 0 || !m.draft_model_path.empty()
          ? fmt::format("; draft round {:.2f} ms + {:.2f} ms/sequence ({})", d.fixed, d.per_token,
                        m.draft_model_path.empty()
                            ? fmt::format("the first {} layers", m.draft_layers)
                            : m.draft_model_path)
          : std::string(),
      model.suffix_cache() != nullptr
          ? fmt::format("; suffix cache of recent text {} MiB, drafts up to {}x what a copy "
                        "agrees with",
                        m.speculation_cache_bytes >> 20, m.suffix_length_factor)
          : std::string());
  return sched;
}

// Where the step-time model starts (scheduler/step_time_model.h): the
// `auto` threshold's two timings when they were taken (on all the compute,
// with a whole prompt chunk; they hold attention inside their fixed and
// per-token terms, so the read terms start at 0 and are fitted), else the
// step costs measured at load.
scheduler::StepTimeCoefficients StepTimePrior(const ServingModel& model, bool measured,
                                              const scheduler::DisaggregationCosts& costs,
                                              int32_t chunk_tokens) {
  scheduler::StepTimeCoefficients prior = model.step_costs().linear;
  if (measured && costs.chunk_step > costs.decode_pass) {
    prior =
        scheduler::StepTimeModel::FromTwoSteps(costs.decode_pass, costs.chunk_step, chunk_tokens);
  }
  spdlog::info("step time model: starts at {}, then fitted to the steps that run",
               scheduler::DescribeStepTime(prior, 0));
  return prior;
}

// --disagg_output_threshold=auto: measured on this machine, before the
// scheduler starts.
absl::StatusOr<std::optional<int32_t>> MeasureThreshold(ServingModel& model, int32_t chunk_tokens,
                                                        scheduler::DisaggregationCosts& costs) {
  absl::StatusOr<scheduler::DisaggregationCosts> measured =
      model.MeasureDisaggregationCosts(chunk_tokens);
  if (!measured.ok()) {
    return Failed(StrCat("--disagg_output_threshold=auto: ", measured.status().ToString()));
  }
  costs = *measured;
  const std::optional<int32_t> threshold = scheduler::AutoOutputThreshold(costs);
  spdlog::info(
      "disaggregation threshold auto: decode pass {:.2f} ms, {}-token chunk step {:.2f} ms, "
      "with a decode token {:.2f} ms -> {}",
      costs.decode_pass, chunk_tokens, costs.chunk_step, costs.chunk_with_decode,
      threshold.has_value() ? fmt::format("{} tokens", *threshold) : std::string("off"));
  return threshold;
}

// --served_model_name, or the model file's name without ".gguf".
std::string ServedModelName(const DaemonOptions& options) {
  if (!options.listen.served_model_name.empty()) return options.listen.served_model_name;
  std::string_view file = options.model.model_path;
  file = file.substr(file.rfind('/') + 1);
  if (file.size() > 5 && file.substr(file.size() - 5) == ".gguf") file.remove_suffix(5);
  return std::string(file);
}

// kv@<pod>@<model>, as llm-d's indexer splits it: the pod is --listen with
// a wildcard host replaced by this host's name (what a router can reach).
std::string KvEventsTopic(const DaemonOptions& options) {
  if (!options.kv_events.topic.empty()) return options.kv_events.topic;
  std::string listen = options.listen.grpc.listen;
  const size_t colon = listen.rfind(':');
  const std::string host = ListenHost(listen);
  if (host == "0.0.0.0" || host == "::" || host == "*") {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) == 0) listen = StrCat(name, listen.substr(colon));
  }
  return StrCat("kv@", listen, "@", ServedModelName(options));
}

// The OpenAI-compatible HTTP API beside gRPC, on the same frontend. Its
// health follows the gRPC health service's rule: not while draining or while
// the scheduler stalls.
absl::Status StartHttp(const DaemonOptions& options, const ServingModel& model,
                       GenerationFrontend* frontend, std::unique_ptr<OpenAiService>& service,
                       std::unique_ptr<HttpServer>& server) {
  OpenAiServiceOptions http;
  http.served_model_name = ServedModelName(options);
  if (std::string name = model.Info().name(); !name.empty()) {
    http.aliases.push_back(std::move(name));
  }
  http.api_keys = options.listen.grpc.api_keys;
  scheduler::Scheduler* sched = frontend->scheduler();
  const absl::Duration stall_timeout = options.stall_timeout;
  http.healthy = [sched, stall_timeout] {
    return !scheduler::Stalled(sched->Load(), absl::Now(), stall_timeout);
  };
  const std::string served_name = http.served_model_name;
  service = std::make_unique<OpenAiService>(frontend, std::move(http));
  absl::StatusOr<std::unique_ptr<HttpServer>> started =
      HttpServer::Start(options.listen.http, service.get());
  if (!started.ok()) return started.status();
  server = *std::move(started);
  spdlog::info("serving the OpenAI-compatible HTTP API on {}:{}{} as model '{}'",
               options.listen.http.host, server->port(),
               options.listen.http.tls_cert_file.empty() ? "" : " (HTTPS)", served_name);
  return absl::OkStatus();
}

}  // namespace

Daemon::Daemon(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}
Daemon::~Daemon() = default;

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  auto parts = std::make_unique<Parts>();
  Parts& p = *parts;
  p.options = options;
  const Role role = options.role;
  spdlog::info("device: {} ({})", kernels::DeviceName(options.device.device),
               options.device.reason);
  if (options.listen.grpc.api_keys != nullptr) {
    spdlog::info("API keys: {} accepted (from {})", options.listen.grpc.api_keys->size(),
                 options.listen.api_keys_file);
  }

  absl::StatusOr<std::unique_ptr<ServingModel>> model = LoadModel(options);
  if (!model.ok()) return model.status();
  p.model = *std::move(model);

  scheduler::SchedulerOptions sched = SchedulerOptionsFor(options, *p.model);
  std::optional<int32_t> threshold = options.output_threshold;
  scheduler::DisaggregationCosts disagg_costs;
  if (options.auto_threshold) {
    absl::StatusOr<std::optional<int32_t>> measured =
        MeasureThreshold(*p.model, sched.max_batched_tokens, disagg_costs);
    if (!measured.ok()) return measured.status();
    threshold = *measured;
  }
  sched.disaggregation.output_threshold = role == Role::kDecode ? std::nullopt : threshold;
  // The measurements are done and no block holds anything yet: their KV
  // pages (~60 MB on the default model) need not stay resident.
  p.model->ReleaseKvPages();
  EnableSlidingRelease(*p.model, options, sched);

  step::Worker* prefill_worker = p.model->prefill_worker();
  step::Worker* decode_worker = p.model->decode_worker();
  PeerServiceOptions peer_options;
  peer_options.vocab_size = p.model->tokenizer().vocab_size();
  peer_options.kv_transport = options.pool.kv_transport;
  if (options.fault.has_value()) {
    const scheduler::FaultSpec& fault = *options.fault;
    if (fault.lane == "kv_transfer" && role != Role::kDecode) {
      // A prefill daemon's: its RemoteDecoder's (below).
    } else if (fault.lane == "kv_transfer" && fault.kind == scheduler::FaultSpec::Kind::kStall) {
      peer_options.stall_transfer = fault.step;
      peer_options.stall_duration = fault.stall;
      spdlog::warn("--inject_fault: KV transfer {} will stall for {} (testing only)", fault.step,
                   absl::FormatDuration(fault.stall));
    } else if (fault.lane == "kv_transfer" && fault.kind == scheduler::FaultSpec::Kind::kOverread) {
      peer_options.overread_transfer = fault.step;
      spdlog::warn(
          "--inject_fault: KV transfer {} will ask for a block it was not offered "
          "(testing only)",
          fault.step);
    } else if (fault.lane == "kv_transfer") {
      peer_options.fail_transfer = fault.step;
      spdlog::warn("--inject_fault: KV transfer {} will fail (testing only)", fault.step);
    } else {
      step::Worker*& target = fault.lane == "decode" ? decode_worker : prefill_worker;
      p.faulty = std::make_unique<scheduler::FaultInjectingWorker>(target, fault);
      target = p.faulty.get();
      spdlog::warn("--inject_fault: a fault will be injected in the {} worker (testing only)",
                   fault.lane);
    }
  }

  p.registry = std::make_shared<prometheus::Registry>();
  p.metrics = std::make_unique<ServerMetrics>(*p.registry);
  ServerMetrics* metrics = p.metrics.get();
  if (const KvEventsOptions& events = options.kv_events; !events.endpoint.empty()) {
    KvEventPublisherOptions publisher;
    publisher.endpoint = events.endpoint;
    publisher.replay_endpoint = events.replay_endpoint;
    publisher.topic = KvEventsTopic(options);
    publisher.block_size = p.model->block_size();
    publisher.replay_messages = events.replay_messages;
    absl::StatusOr<std::unique_ptr<KvEventPublisher>> started =
        KvEventPublisher::Start(publisher, *p.registry);
    if (!started.ok()) return started.status();
    p.kv_events = *std::move(started);
    KvEventPublisher* kv_events = p.kv_events.get();
    sched.on_kv_events = [kv_events](std::vector<kvcache::KvEvent> batch) {
      return kv_events->Publish(std::move(batch));
    };
    spdlog::info("KV events: published on {} as '{}'{}{}", events.endpoint, publisher.topic,
                 events.replay_endpoint.empty() ? "" : ", replayed on ", events.replay_endpoint);
    if (!options.scheduler.prefix_caching) {
      spdlog::warn("KV events: --prefix_caching=false: no block is ever cached or published");
    }
  }
  p.scheduler = std::make_unique<scheduler::Scheduler>(
      sched, options.max_queued_requests, prefill_worker, decode_worker,
      [metrics](const scheduler::StepStats& step) { metrics->OnStep(step); }, options.dispatch,
      options.admission_by_slo);
  const scheduler::StepTimeCoefficients prior =
      StepTimePrior(*p.model, options.auto_threshold, disagg_costs, sched.max_batched_tokens);
  p.scheduler->CalibrateStepTime(prior);
  // Handing off locally (a decode worker here) or to decode daemons.
  const bool can_hand_off = p.model->decode_worker() != nullptr || role == Role::kPrefill;
  const bool hands_off = threshold.has_value() && can_hand_off;
  const bool slo = sched.slo_policy;
  if (slo) {
    spdlog::info(
        "role {}; policy slo: budgets TTFT {} and TPOT {} (requests may bring their own){}; "
        "paths {}",
        RoleName(role), absl::FormatDuration(sched.slo.ttft), absl::FormatDuration(sched.slo.tpot),
        options.admission_by_slo ? ", requests predicted to miss their TTFT refused" : "",
        can_hand_off ? (role == Role::kPrefill ? "by forecast, to the decode peers" : "by forecast")
                     : "colocated (no decode worker)");
    if (can_hand_off) {
      // Where a lone 128-token-prompt stream would move, with a few steps'
      // worth of prompts waiting (at no load it never does: nothing delays it).
      scheduler::PathLoad load;
      load.max_chunk = sched.max_batched_tokens;
      load.min_chunk = std::min(sched.min_prompt_chunk, sched.max_batched_tokens);
      load.prompt_backlog = 4 * sched.max_batched_tokens;
      scheduler::StepTimeModel time_model(prior);
      time_model.SetRowCurve(sched.row_curve);
      const std::optional<int32_t> crossover =
          scheduler::DisaggregationCrossover(time_model, load, sched.slo, 128);
      spdlog::info("a lone stream moves to the decode worker {} while {} prompt tokens wait",
                   crossover ? fmt::format("from {} output tokens", *crossover)
                             : std::string("at no output length"),
                   load.prompt_backlog);
    }
  } else {
    spdlog::info("role {}; policy threshold; disaggregation: {}", RoleName(role),
                 hands_off
                     ? fmt::format("at {} output tokens{}{}", *threshold,
                                   sched.disaggregation.use_max_tokens ? " (or max_tokens)" : "",
                                   role == Role::kPrefill ? ", to the decode peers" : "")
                     : std::string("off"));
  }

  // Two workers with KV storages of their own: handoffs move pages.
  const std::string& transport = options.pool.kv_transport;
  if (p.model->decode_kv_blocks() > 0) {
    absl::StatusOr<std::unique_ptr<LaneKvMover>> mover =
        LaneKvMover::Create(p.model->kv_backend(), *p.model->decode_backend(), transport, metrics);
    if (!mover.ok()) {
      return Failed(StrCat("--decode_kv_cache_bytes: cannot start the KV transport: ",
                           mover.status().ToString()));
    }
    p.lane_mover = *std::move(mover);
    p.lane_mover->SetScheduler(p.scheduler.get());
    p.scheduler->SetBlockMover(p.lane_mover.get());
    spdlog::info("decode worker: KV storage of its own ({} blocks); handoffs move pages over {}",
                 p.model->decode_kv_blocks(), transport);
  }

  // Several daemons: the KV transport, and the link to the decode peers.
  if (role != Role::kUnified) {
    absl::StatusOr<KvEndpoint> endpoint =
        StartKvEndpoint(p.model->kv_backend(), transport, options.pool.kv_transport_ports);
    if (!endpoint.ok()) {
      return Failed(StrCat("cannot start the KV transport: ", endpoint.status().ToString()));
    }
    p.kv_endpoint = std::make_unique<KvEndpoint>(*std::move(endpoint));
    spdlog::info("KV transport: {} over {} ({} MiB of KV pages registered)",
                 p.kv_endpoint->agent->backend(), transport,
                 (static_cast<int64_t>(p.kv_endpoint->shape.blocks) *
                  static_cast<int64_t>(p.kv_endpoint->shape.BytesPerBlock())) >>
                     20);
  }

  FrontendOptions frontend_options;
  frontend_options.defaults = options.requests.defaults;
  frontend_options.max_prompt_tokens = options.requests.max_prompt_tokens;
  frontend_options.default_deadline = options.requests.default_deadline;
  frontend_options.slow_reader_timeout = options.requests.slow_reader_timeout;
  frontend_options.accepts_prompts = role != Role::kDecode;
  frontend_options.arithmetic = p.model->kv_backend().arithmetic();
  v1::ModelInfo& info = frontend_options.model_info;
  info = p.model->Info();
  info.set_disagg_output_threshold(hands_off ? *threshold : -1);
  info.set_disagg_output_threshold_auto(options.auto_threshold);
  info.set_speculative(options.speculative);
  info.set_policy(slo ? "slo" : "threshold");
  info.set_slo_ttft_ms(absl::ToDoubleMilliseconds(sched.slo.ttft));
  info.set_slo_tpot_ms(absl::ToDoubleMilliseconds(sched.slo.tpot));
  frontend_options.slo_paths = slo && can_hand_off;
  p.frontend = std::make_unique<GenerationFrontend>(p.model.get(), p.scheduler.get(), metrics,
                                                    frontend_options);
  GenerationFrontend* service = p.frontend.get();
  p.service = std::make_unique<GenerationService>(service);
  if (role == Role::kDecode) {
    peer_options.load = [service] { return service->Load(); };
    p.peer_service = std::make_unique<PeerService>(
        p.scheduler.get(), p.kv_endpoint.get(), metrics, service->open_calls_counter(),
        [service] { return service->accepting(); }, peer_options);
  }

  p.scheduler_collector = std::make_shared<SchedulerCollector>(
      p.scheduler.get(), p.model->block_size(), hands_off ? *threshold : -1,
      options.auto_threshold ? std::optional(disagg_costs) : std::nullopt,
      [service] { return service->open_calls(); }, slo ? "slo" : "threshold");
  p.scheduler_collector->set_suffix_cache(p.model->suffix_cache());
  if (const std::string& address = options.listen.metrics; !address.empty()) {
    try {
      p.exposer = std::make_unique<prometheus::Exposer>(address);
      p.exposer->RegisterCollectable(p.registry);
      p.exposer->RegisterCollectable(p.scheduler_collector);
    } catch (const std::exception& e) {
      return Failed(StrCat("cannot serve metrics on ", address, ": ", e.what()));
    }
  }

  std::vector<grpc::Service*> services = {p.service.get()};
  const PoolOptions& pool = options.pool;
  if (p.peer_service != nullptr && pool.peer_listen.empty()) {
    services.push_back(p.peer_service.get());
  }
  GrpcServerOptions grpc_options = options.listen.grpc;
  grpc_options.on_unauthenticated = [metrics] { metrics->OnUnauthenticated(); };
  absl::StatusOr<std::unique_ptr<grpc::Server>> grpc_server =
      StartGrpcServer(grpc_options, services);
  // Whatever went wrong, the listen address or the TLS files were refused.
  if (!grpc_server.ok()) return absl::InvalidArgumentError(grpc_server.status().ToString());
  p.grpc_server = *std::move(grpc_server);
  if (p.peer_service != nullptr && !pool.peer_listen.empty()) {
    // The Peer service alone, on its own port: mutual TLS with --peer_tls_*
    // (a prefill daemon without a certificate of the pool's CA is refused
    // in the handshake), the API keys as on --listen.
    GrpcServerOptions peer = grpc_options;
    peer.listen = pool.peer_listen;
    peer.tls_cert_file = pool.peer_tls_cert;
    peer.tls_key_file = pool.peer_tls_key;
    peer.tls_client_ca = pool.peer_tls_ca;
    peer.tls_cert_flag = "--peer_tls_cert";
    peer.tls_key_flag = "--peer_tls_key";
    peer.tls_client_ca_flag = "--peer_tls_ca";
    absl::StatusOr<std::unique_ptr<grpc::Server>> peer_server =
        StartGrpcServer(peer, {p.peer_service.get()});
    if (!peer_server.ok()) {
      return absl::InvalidArgumentError(StrCat("--peer_listen: ", peer_server.status().message()));
    }
    p.peer_server = *std::move(peer_server);
    spdlog::info("serving tandem.v1.Peer on {}{}", pool.peer_listen,
                 pool.peer_tls_ca.empty() ? "" : " (mutual TLS)");
  }

  // A prefill daemon finds its peers before it serves (one round of name
  // resolution and GetLoad).
  if (role == Role::kPrefill) {
    RemoteDecoderOptions remote;
    remote.peers = options.pool.decode_peers;
    remote.load_interval = options.pool.peer_load_interval;
    remote.api_key = options.listen.grpc.api_keys != nullptr ? options.listen.grpc.api_keys->first()
                                                             : std::string();
    remote.max_message_bytes = options.listen.grpc.max_message_bytes;
    if (options.fault.has_value() && options.fault->lane == "kv_transfer") {
      remote.stall_offer = options.fault->step;
      remote.stall_duration = options.fault->stall;
      spdlog::warn("--inject_fault: the KV transport stalls for {} at offer {} (testing only)",
                   absl::FormatDuration(remote.stall_duration), remote.stall_offer);
    }
    if (!pool.peer_tls_ca.empty()) {
      for (const auto& [path, flag, pem] :
           {std::tuple{pool.peer_tls_cert, "--peer_tls_cert", &remote.tls_cert},
            std::tuple{pool.peer_tls_key, "--peer_tls_key", &remote.tls_key},
            std::tuple{pool.peer_tls_ca, "--peer_tls_ca", &remote.tls_ca}}) {
        absl::StatusOr<std::string> read = ReadFlagFile(path, flag);
        if (!read.ok()) return absl::InvalidArgumentError(read.status().message());
        *pem = *std::move(read);
      }
    }
    p.remote_decoder = std::make_unique<RemoteDecoder>(std::move(remote), p.scheduler.get(),
                                                       p.kv_endpoint.get(), metrics);
    p.scheduler->SetRemoteDecodeLink(p.remote_decoder.get());
    spdlog::info("decode peers: {} ready of {}", p.remote_decoder->ready_peers(),
                 absl::StrJoin(options.pool.decode_peers, ","));
  }

  if (options.listen.http_enabled) {
    if (absl::Status s = StartHttp(options, *p.model, p.frontend.get(), p.openai, p.http_server);
        !s.ok()) {
      return s;
    }
  }

  p.grpc_server->GetHealthCheckService()->SetServingStatus(true);
  spdlog::info("serving tandem.v1.Generation on {}{}; metrics on {}", options.listen.grpc.listen,
               options.listen.grpc.tls_cert_file.empty() ? "" : " (TLS)",
               options.listen.metrics.empty() ? "(off)" : options.listen.metrics);
  return std::unique_ptr<Daemon>(new Daemon(std::move(parts)));
}

void Daemon::ServeUntil(absl::Notification& shutdown) {
  grpc::HealthCheckServiceInterface* health = parts_->grpc_server->GetHealthCheckService();
  const absl::Duration stall_timeout = parts_->options.stall_timeout;
  bool stalled = false;
  while (!shutdown.WaitForNotificationWithTimeout(absl::Seconds(1))) {
    const scheduler::SchedulerLoad load = parts_->scheduler->Load();
    const bool now_stalled = scheduler::Stalled(load, absl::Now(), stall_timeout);
    if (now_stalled == stalled) continue;
    stalled = now_stalled;
    health->SetServingStatus(!stalled);
    if (stalled) {
      spdlog::error("the scheduler has completed no step for {}: reporting NOT_SERVING",
                    absl::FormatDuration(stall_timeout));
    } else {
      spdlog::info("the scheduler is making progress again: reporting SERVING");
    }
  }
}

void Daemon::Drain() {
  Parts& p = *parts_;
  p.grpc_server->GetHealthCheckService()->SetServingStatus(false);
  if (p.peer_server != nullptr) p.peer_server->GetHealthCheckService()->SetServingStatus(false);
  p.frontend->StopAccepting();
  const absl::Duration drain = p.options.drain_timeout;
  spdlog::info("draining {} open call(s) for up to {}", p.frontend->open_calls(),
               absl::FormatDuration(drain));
  const absl::Time drain_deadline = absl::Now() + drain;
  while (p.frontend->open_calls() > 0 && absl::Now() < drain_deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (const int64_t left = p.frontend->open_calls(); left > 0) {
    spdlog::warn("drain timeout: cancelling {} call(s) with UNAVAILABLE", left);
  }
  // From here gRPC's own shutdown may end a call that arrives meanwhile
  // with CANCELLED instead of our UNAVAILABLE (grpc/grpc#41785).
  spdlog::info("drained: shutting down the gRPC server");
  p.scheduler->Stop();
  const auto shutdown_deadline = absl::ToChronoTime(absl::Now() + absl::Seconds(5));
  p.grpc_server->Shutdown(shutdown_deadline);
  if (p.peer_server != nullptr) p.peer_server->Shutdown(shutdown_deadline);
  p.grpc_server->Wait();
  if (p.peer_server != nullptr) p.peer_server->Wait();
  if (p.http_server != nullptr) p.http_server->Shutdown();
  spdlog::info("stopped");
}

int StartupExitCode(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace tandem::server
