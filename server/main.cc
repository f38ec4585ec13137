// tandemd: the Tandem serving daemon.
//
// Start-up: load and check the model, warm it up, start the scheduler, the
// gRPC server (Generation, health, reflection) and the metrics exposer, then
// report SERVING. SIGTERM/SIGINT: report NOT_SERVING, stop accepting, let
// in-flight requests finish for up to --drain_timeout, cancel the rest,
// exit 0.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/kernels/backend_factory.h"
#include "engine/kernels/cuda/cuda_loader.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "scheduler/fault_injection.h"
#include "scheduler/scheduler.h"
#include "server/generation_service.h"
#include "server/grpc_server.h"
#include "server/kv_endpoint.h"
#include "server/lane_kv_mover.h"
#include "server/logging.h"
#include "server/peer_service.h"
#include "server/remote_decoder.h"
#include "server/scheduler_collector.h"
#include "server/server_metrics.h"
#include "server/serving_model.h"
#include "spdlog/spdlog.h"

namespace {

std::string DefaultModelPath() {
  const char* dir = std::getenv("TANDEM_MODEL_DIR");
  return (std::filesystem::path(dir != nullptr && *dir ? dir : "models") /
          "SmolLM2-135M-Instruct.Q4_1.gguf")
      .string();
}

}  // namespace

ABSL_FLAG(std::string, model, DefaultModelPath(),
          "GGUF model file (default: $TANDEM_MODEL_DIR or models/, "
          "SmolLM2-135M-Instruct.Q4_1.gguf, fetched by scripts/fetch-model), or "
          "random:NAME[@SEED] for a model of a known shape with random weights (llama3-8b, "
          "qwen2.5-7b, smollm2-135m: for speed measurements)");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9400",
          "Prometheus metrics address (IPv4 host:port); empty disables");
ABSL_FLAG(std::string, device, "auto",
          "where the model runs: cpu, cuda, or auto (CUDA when the CUDA module has a backend and "
          "sees a device, else the CPU; the log says which and why)");
ABSL_FLAG(bool, cuda_graphs, true,
          "record decode steps as CUDA graphs and replay them (--device=cuda; docs/cuda.md)");
ABSL_FLAG(int, cuda_decode_sms, -1,
          "--device=cuda with a decode worker: SMs a running prefill leaves free while decode "
          "steps run (a green-context SM partition the prefill switches to, where the driver has "
          "them); -1: an eighth of the GPU's SMs, 0: none (stream priorities only)");
ABSL_FLAG(int, threads, 0,
          "CPU threads that compute, shared by the prefill and decode workers (decode steps "
          "first); 0: one per CPU the process may use");
ABSL_FLAG(int, decode_reserved_threads, 0,
          "threads of --threads set aside for the decode worker alone, on CPUs of their own "
          "(hard isolation); 0: one shared pool");
ABSL_FLAG(bool, pin_threads, true, "pin compute threads to CPUs");
ABSL_FLAG(absl::Duration, decode_step_interval, absl::Milliseconds(40),
          "while prompts are being prefilled, decode-worker steps start at most this often (the "
          "inter-token target of disaggregated streams); 0: as soon as ready");
ABSL_FLAG(double, prefill_min_share, 0.5,
          "the least share of time the prefill worker keeps while both workers have work, "
          "when decode steps grow long; in [0, 1)");
ABSL_FLAG(std::string, disagg_output_threshold, "32",
          "hand a request to the decode worker when its output reaches this many tokens "
          "(or earlier when it is known to); 0: every request; off: never (no decode worker); "
          "auto: measured at start-up");
ABSL_FLAG(bool, disagg_on_max_tokens, false,
          "treat max_tokens as the expected output length when nothing better is known");
ABSL_FLAG(absl::Duration, priority_aging, absl::Seconds(10),
          "a waiting request gains one priority level per this long waited (no starvation)");
ABSL_FLAG(std::string, cpu_matmul, "auto",
          "CPU matrix products: f32 (dequantized weights x float activations, the model's own "
          "arithmetic), bf16 (activations rounded to bfloat16 times the exact quants, summed in "
          "float32: twice the rate on CPUs with AVX-512 BF16), q8 (8-bit activations as "
          "llama.cpp does: less exact), or auto (bf16 where the CPU has it, else f32)");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{512} << 20, "bytes of paged KV cache");
ABSL_FLAG(int64_t, decode_kv_cache_bytes, 0,
          "> 0: the decode worker keeps its KV in storage of its own of this many bytes (as a "
          "decode worker on another device would) and each handoff moves the request's pages "
          "there through the KV transport (--kv_transport); 0: both workers share one KV cache");
ABSL_FLAG(double, kv_cache_memory_fraction, 0.0,
          "if > 0, size the KV cache to this fraction of the memory the device has free at "
          "start-up (the host's MemAvailable, or the GPU's free memory), less what the weights "
          "will take of it, instead of --kv_cache_bytes");
ABSL_FLAG(bool, prefix_caching, true,
          "reuse the KV blocks of prompt prefixes seen before (per cache_salt)");
ABSL_FLAG(int, block_size, 16, "tokens per KV block");
ABSL_FLAG(int, context_length, 0, "tokens per sequence (0: the model's context length)");
ABSL_FLAG(int, max_batched_tokens, 128,
          "tokens per step of one worker, all its sequences together (the prefill chunk size)");
ABSL_FLAG(int, max_running, 64, "sequences in the running batch");
ABSL_FLAG(int, max_queued_requests, 256,
          "requests waiting to run; more are refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_queued_tokens, 262144,
          "prompt tokens that may wait at once; a request that would pass it gets "
          "RESOURCE_EXHAUSTED unless nothing waits (0: no limit)");
ABSL_FLAG(int, max_prompt_tokens, 0,
          "longest prompt accepted, in tokens (INVALID_ARGUMENT beyond it; 0: the context "
          "length minus one)");
ABSL_FLAG(int, max_concurrent_streams, 100,
          "concurrent calls per client connection (HTTP/2 streams); more wait in the client");
ABSL_FLAG(absl::Duration, default_deadline, absl::Minutes(10),
          "deadline for requests whose client set none (DEADLINE_EXCEEDED after it); "
          "0: none");
ABSL_FLAG(absl::Duration, slow_reader_timeout, absl::Seconds(60),
          "a stream whose client reads nothing for this long (its next message cannot be "
          "sent) is cancelled, freeing its request slot and KV blocks; 0: never");
ABSL_FLAG(int, max_tokens_default, 2048, "max_tokens for requests that set none");
ABSL_FLAG(double, default_temperature, 0.8, "sampling temperature for requests that set none");
ABSL_FLAG(double, default_top_p, 0.95, "top-p, in (0, 1], for requests that set none");
ABSL_FLAG(int, default_top_k, 40, "top-k for requests that set none (0: off)");
ABSL_FLAG(std::string, chat_template, "",
          "chat template family (chatml, llama3); empty: detected from the model");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "on SIGTERM, how long in-flight requests may take before they are cancelled");
ABSL_FLAG(absl::Duration, stall_timeout, absl::Seconds(60),
          "report NOT_SERVING when requests are pending and no step has completed for this long");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain; with --tls_key serves TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificates; when set, clients must present a certificate they signed (mTLS)");
ABSL_FLAG(std::string, api_keys_file, "",
          "file of accepted API keys, one per line; requests must send 'authorization: Bearer "
          "<key>' (health checks and reflection stay open)");
ABSL_FLAG(int, max_message_bytes, 64 << 20, "largest gRPC message accepted or sent");
ABSL_FLAG(
    std::string, speculative, "ngram",
    "speculative decoding for requests that do not opt out: off, ngram (drafts from "
    "earlier text of the sequence), or draft (a draft model: --draft_model or --draft_layers)");
ABSL_FLAG(int, spec_max_draft, 8, "most tokens a sequence drafts per step");
ABSL_FLAG(bool, spec_adaptive, true,
          "choose draft lengths from each sequence's acceptance and the batch's cost (false: "
          "always --spec_max_draft)");
ABSL_FLAG(int, ngram_min, 1, "shortest match the n-gram proposer looks up");
ABSL_FLAG(int, ngram_max, 3, "longest match the n-gram proposer looks up");
ABSL_FLAG(std::string, draft_model, "",
          "the draft model for --speculative=draft: a smaller GGUF model with the same "
          "vocabulary (its KV takes memory beyond --kv_cache_bytes)");
ABSL_FLAG(int, draft_layers, 0,
          "the draft model for --speculative=draft: the model's own first N layers and "
          "output head (layer-skip self-speculation); 0: none");
ABSL_FLAG(std::string, log_format, "text", "text, or json (one JSON object per line)");
ABSL_FLAG(std::string, inject_fault, "",
          "testing only: a fault in one worker's steps, LANE:KIND@STEP[:DURATION] with KIND "
          "error, throw or stall (e.g. prefill:error@3, decode:stall@2:3s), or in a decode "
          "daemon's Nth KV transfer (kv_transfer:error@N: it fails half way)");
ABSL_FLAG(std::string, role, "unified",
          "unified (prefill and decode here), prefill (hand requests that reach "
          "--disagg_output_threshold to the decode daemons of --decode_peers), or decode (take "
          "requests over from prefill daemons; no prompts from clients)");
ABSL_FLAG(std::string, decode_peers, "",
          "--role=prefill: the decode daemons, host:port[,host:port...]; a name that resolves "
          "to several addresses (a Kubernetes headless Service) is several peers");
ABSL_FLAG(std::string, kv_transport, "tcp",
          "UCX transports for KV pages between daemons, as UCX_TLS takes them (tcp; rc,cuda_copy "
          "where the hardware has them)");
ABSL_FLAG(absl::Duration, kv_lease, absl::Seconds(30),
          "--role=prefill: how long offered KV pages are held for the decode daemon to read; "
          "after it the request continues here");
ABSL_FLAG(absl::Duration, peer_load_interval, absl::Milliseconds(200),
          "--role=prefill: how often each decode peer's GetLoad is polled");

namespace tandem {
namespace {

// Waits for SIGTERM or SIGINT on a dedicated thread (the signals are blocked
// everywhere else), so shutdown runs as ordinary code, not in a handler.
std::thread StartSignalThread(absl::Notification* shutdown) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return std::thread([signals, shutdown] {
    int signal = 0;
    sigwait(&signals, &signal);
    spdlog::info("received {}, draining", signal == SIGTERM ? "SIGTERM" : "SIGINT");
    shutdown->Notify();
  });
}

// Runs one token through the worker so that weights are paged in and buffers
// allocated before the first request.
absl::Status WarmUp(server::ServingModel& model) {
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

int Main() {
  absl::Notification shutdown;
  std::thread signal_thread = StartSignalThread(&shutdown);
  signal_thread.detach();

  absl::StatusOr<kernels::DeviceChoice> device =
      kernels::ChooseDevice(absl::GetFlag(FLAGS_device),
                            kernels::cuda::ProbeCudaModule(kernels::cuda::DefaultCudaModulePath()));
  if (!device.ok()) {
    spdlog::error("{}", std::string(device.status().message()));
    return 2;
  }
  spdlog::info("device: {} ({})", kernels::DeviceName(device->device), device->reason);

  const std::string role = absl::GetFlag(FLAGS_role);
  if (role != "unified" && role != "prefill" && role != "decode") {
    spdlog::error("--role='{}': expected unified, prefill or decode", role);
    return 2;
  }
  std::vector<std::string> decode_peers;
  if (const std::string peers = absl::GetFlag(FLAGS_decode_peers); role == "prefill") {
    absl::StatusOr<std::vector<std::string>> parsed = server::ParsePeerList(peers);
    if (!parsed.ok()) {
      spdlog::error("--role=prefill: {}", std::string(parsed.status().message()));
      return 2;
    }
    decode_peers = *std::move(parsed);
  } else if (!peers.empty()) {
    spdlog::error("--decode_peers is for --role=prefill (this daemon has --role={})", role);
    return 2;
  }

  absl::StatusOr<kernels::cpu::MatMulMode> matmul_mode =
      kernels::cpu::ParseMatMulMode(absl::GetFlag(FLAGS_cpu_matmul));
  if (!matmul_mode.ok()) {
    spdlog::error("--cpu_matmul: {}", std::string(matmul_mode.status().message()));
    return 2;
  }
  server::ServingModelOptions options;
  options.matmul_mode = *matmul_mode;
  options.device = device->device;
  options.step_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  options.cuda_decode_sms = absl::GetFlag(FLAGS_cuda_decode_sms);
  if (options.cuda_decode_sms < -1) {
    spdlog::error("--cuda_decode_sms={}: expected -1 (auto), 0 (off) or a count of SMs",
                  options.cuda_decode_sms);
    return 2;
  }
  options.model_path = absl::GetFlag(FLAGS_model);
  options.chat_template = absl::GetFlag(FLAGS_chat_template);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.decode_reserved_threads = absl::GetFlag(FLAGS_decode_reserved_threads);
  options.pin_threads = absl::GetFlag(FLAGS_pin_threads);
  if (options.threads < 0) {
    spdlog::error("--threads={}: must be >= 0 (0: one per CPU)", options.threads);
    return 2;
  }
  std::optional<int32_t> threshold;
  const std::string threshold_flag = absl::GetFlag(FLAGS_disagg_output_threshold);
  const bool auto_threshold = threshold_flag == "auto";
  if (threshold_flag != "off" && !auto_threshold) {
    int32_t value = 0;
    if (!absl::SimpleAtoi(threshold_flag, &value) || value < 0) {
      spdlog::error("--disagg_output_threshold='{}': expected a token count >= 0, 'auto' or 'off'",
                    threshold_flag);
      return 2;
    }
    threshold = value;
  }
  // A prefill daemon hands decoding to its peers, a decode daemon only
  // decodes: either way one worker takes all the compute here.
  options.decode_worker = threshold_flag != "off" && role == "unified";
  if (role == "prefill" && !threshold.has_value() && !auto_threshold) {
    spdlog::error(
        "--role=prefill needs --disagg_output_threshold (a token count or auto), not off");
    return 2;
  }
  scheduler::DecodePacingOptions pacing;
  pacing.interval = absl::GetFlag(FLAGS_decode_step_interval);
  pacing.prefill_min_share = absl::GetFlag(FLAGS_prefill_min_share);
  if (absl::Status s = scheduler::ValidatePacing(pacing); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  // Reserved decode threads share nothing with prefill: nothing to pace.
  if (options.decode_reserved_threads > 0) pacing = {absl::ZeroDuration(), 0.0};
  server::RequestDefaults defaults;
  defaults.max_tokens = absl::GetFlag(FLAGS_max_tokens_default);
  defaults.temperature = static_cast<float>(absl::GetFlag(FLAGS_default_temperature));
  defaults.top_p = static_cast<float>(absl::GetFlag(FLAGS_default_top_p));
  defaults.top_k = absl::GetFlag(FLAGS_default_top_k);
  if (absl::Status s = server::ValidateDefaults(defaults); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  options.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  options.kv_cache_memory_fraction = absl::GetFlag(FLAGS_kv_cache_memory_fraction);
  if (!(options.kv_cache_memory_fraction >= 0.0 && options.kv_cache_memory_fraction < 1.0)) {
    spdlog::error("--kv_cache_memory_fraction={}: must be in [0, 1) (0: use --kv_cache_bytes)",
                  options.kv_cache_memory_fraction);
    return 2;
  }
  options.decode_kv_cache_bytes = absl::GetFlag(FLAGS_decode_kv_cache_bytes);
  if (options.decode_kv_cache_bytes < 0 ||
      (options.decode_kv_cache_bytes > 0 && !options.decode_worker)) {
    spdlog::error(
        "--decode_kv_cache_bytes={}: needs a decode worker (--role=unified, "
        "--disagg_output_threshold not off) and a size >= 0",
        options.decode_kv_cache_bytes);
    return 2;
  }
  options.block_size = absl::GetFlag(FLAGS_block_size);
  options.context_length = absl::GetFlag(FLAGS_context_length);
  options.ngram_min = absl::GetFlag(FLAGS_ngram_min);
  options.ngram_max = absl::GetFlag(FLAGS_ngram_max);
  options.draft_layers = absl::GetFlag(FLAGS_draft_layers);
  options.draft_model_path = absl::GetFlag(FLAGS_draft_model);
  step::Proposer proposer = step::Proposer::kNone;
  if (const std::string mode = absl::GetFlag(FLAGS_speculative); mode == "ngram") {
    proposer = step::Proposer::kNgram;
  } else if (mode == "draft") {
    proposer = step::Proposer::kDraftModel;
    if (options.draft_layers <= 0 && options.draft_model_path.empty()) {
      spdlog::error("--speculative=draft needs a draft model: set --draft_model or --draft_layers");
      return 2;
    }
  } else if (mode != "off") {
    spdlog::error("--speculative='{}': expected off, ngram or draft", mode);
    return 2;
  }
  if (absl::GetFlag(FLAGS_spec_max_draft) < 0) {
    spdlog::error("--spec_max_draft must be >= 0");
    return 2;
  }
  const absl::Time load_start = absl::Now();
  absl::StatusOr<std::unique_ptr<server::ServingModel>> model = server::ServingModel::Load(options);
  if (!model.ok()) {
    spdlog::error("cannot load the model: {}", model.status().ToString());
    return 1;
  }
  if (absl::Status s = WarmUp(**model); !s.ok()) {
    spdlog::error("warm-up failed: {}", s.ToString());
    return 1;
  }
  const model::ModelConfig& config = (*model)->config();
  spdlog::info(
      "model '{}' ({}, {} layers, vocab {}, context {}) on {}; chat template {}; {} KV blocks of "
      "{} tokens ({} MiB); ready in {:.2f}s",
      config.name, config.architecture, config.layers, config.vocab, (*model)->context_length(),
      (*model)->backend_name(), (*model)->chat_template().family_name(), (*model)->kv_blocks(),
      (*model)->block_size(), options.kv_cache_bytes >> 20,
      absl::ToDoubleSeconds(absl::Now() - load_start));

  scheduler::SchedulerOptions sched;
  sched.max_batched_tokens = absl::GetFlag(FLAGS_max_batched_tokens);
  sched.max_running = absl::GetFlag(FLAGS_max_running);
  sched.block_size = (*model)->block_size();
  sched.kv_blocks = (*model)->kv_blocks();
  sched.decode_kv_blocks = (*model)->decode_kv_blocks();
  sched.context_length = (*model)->context_length();
  sched.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  sched.disaggregation.use_max_tokens = absl::GetFlag(FLAGS_disagg_on_max_tokens);
  sched.priority_aging = absl::GetFlag(FLAGS_priority_aging);
  sched.speculation.proposer = proposer;
  sched.speculation.max_draft = absl::GetFlag(FLAGS_spec_max_draft);
  sched.speculation.adaptive = absl::GetFlag(FLAGS_spec_adaptive);
  sched.speculation.cost = (*model)->step_cost();
  {
    const scheduler::StepCostModel& c = sched.speculation.cost;
    spdlog::info(
        "speculative decoding: {} (up to {} drafted tokens, {}); step cost {:.2f} ms + {:.2f} "
        "ms/token + {:.2f} ms (+ {:.2f} ms per extra row) per 1,000 context tokens of a "
        "sequence{}",
        absl::GetFlag(FLAGS_speculative), sched.speculation.max_draft,
        sched.speculation.adaptive ? "adaptive" : "fixed", c.fixed, c.per_token,
        1000 * c.per_context, 1000 * c.per_context_extra,
        options.draft_layers > 0 || !options.draft_model_path.empty()
            ? fmt::format("; draft round {:.2f} ms + {:.2f} ms/sequence ({})", c.draft_fixed,
                          c.draft_per_token,
                          options.draft_model_path.empty()
                              ? fmt::format("the first {} layers", options.draft_layers)
                              : options.draft_model_path)
            : std::string());
  }
  for (const std::string& warning : (*model)->warnings()) spdlog::warn("{}", warning);
  if (sched.max_batched_tokens < 1 || sched.max_running < 1) {
    spdlog::error("--max_batched_tokens and --max_running must be at least 1");
    return 2;
  }
  scheduler::DisaggregationCosts disagg_costs;
  if (auto_threshold) {
    absl::StatusOr<scheduler::DisaggregationCosts> costs =
        (*model)->MeasureDisaggregationCosts(sched.max_batched_tokens);
    if (!costs.ok()) {
      spdlog::error("--disagg_output_threshold=auto: {}", costs.status().ToString());
      return 1;
    }
    disagg_costs = *costs;
    threshold = scheduler::AutoOutputThreshold(disagg_costs);
    spdlog::info(
        "disaggregation threshold auto: decode pass {:.2f} ms, {}-token chunk step {:.2f} ms, "
        "with a decode token {:.2f} ms -> {}",
        disagg_costs.decode_pass, sched.max_batched_tokens, disagg_costs.chunk_step,
        disagg_costs.chunk_with_decode,
        threshold.has_value() ? fmt::format("{} tokens", *threshold) : std::string("off"));
  }
  sched.disaggregation.output_threshold = role == "decode" ? std::nullopt : threshold;
  sched.remote_decode = role == "prefill";
  sched.kv_lease = absl::GetFlag(FLAGS_kv_lease);
  if (sched.kv_lease <= absl::ZeroDuration()) {
    spdlog::error("--kv_lease must be > 0");
    return 2;
  }
  sched.max_queued_tokens = absl::GetFlag(FLAGS_max_queued_tokens);
  if (sched.max_queued_tokens < 0) {
    spdlog::error("--max_queued_tokens must be >= 0 (0: no limit)");
    return 2;
  }
  step::Worker* prefill_worker = (*model)->prefill_worker();
  step::Worker* decode_worker = (*model)->decode_worker();
  std::unique_ptr<scheduler::FaultInjectingWorker> faulty;
  server::PeerServiceOptions peer_options;
  if (const std::string fault = absl::GetFlag(FLAGS_inject_fault); !fault.empty()) {
    absl::StatusOr<scheduler::FaultSpec> spec = scheduler::ParseFaultSpec(fault);
    if (!spec.ok()) {
      spdlog::error("{}", std::string(spec.status().message()));
      return 2;
    }
    if (spec->lane == "kv_transfer") {
      if (role != "decode" || spec->kind != scheduler::FaultSpec::Kind::kError) {
        spdlog::error("--inject_fault='{}': kv_transfer takes error@N, on a --role=decode daemon",
                      fault);
        return 2;
      }
      peer_options.fail_transfer = spec->step;
    }
    step::Worker*& target = spec->lane == "decode" ? decode_worker : prefill_worker;
    if (spec->lane == "kv_transfer") {
      spdlog::warn("--inject_fault={}: a KV transfer will fail (testing only)", fault);
    } else if (target == nullptr) {
      spdlog::error("--inject_fault='{}': there is no {} worker", fault, spec->lane);
      return 2;
    } else {
      faulty = std::make_unique<scheduler::FaultInjectingWorker>(target, *spec);
      target = faulty.get();
      spdlog::warn("--inject_fault={}: a fault will be injected (testing only)", fault);
    }
  }
  auto registry = std::make_shared<prometheus::Registry>();
  server::ServerMetrics metrics(*registry);
  scheduler::Scheduler scheduler(
      sched, absl::GetFlag(FLAGS_max_queued_requests), prefill_worker, decode_worker,
      [&metrics](const scheduler::StepStats& step) { metrics.OnStep(step); }, pacing);
  // Handing off locally (a decode worker here) or to decode daemons.
  const bool hands_off =
      threshold.has_value() && ((*model)->decode_worker() != nullptr || role == "prefill");
  spdlog::info("role {}; disaggregation: {}", role,
               hands_off
                   ? fmt::format("at {} output tokens{}{}", *threshold,
                                 sched.disaggregation.use_max_tokens ? " (or max_tokens)" : "",
                                 role == "prefill" ? ", to the decode peers" : "")
                   : std::string("off"));

  // Two workers with KV storages of their own: handoffs move pages.
  std::unique_ptr<server::LaneKvMover> lane_mover;
  if ((*model)->decode_kv_blocks() > 0) {
    absl::StatusOr<std::unique_ptr<server::LaneKvMover>> mover =
        server::LaneKvMover::Create((*model)->kv_backend(), *(*model)->decode_backend(),
                                    absl::GetFlag(FLAGS_kv_transport), &metrics);
    if (!mover.ok()) {
      spdlog::error("--decode_kv_cache_bytes: cannot start the KV transport: {}",
                    mover.status().ToString());
      return 1;
    }
    lane_mover = *std::move(mover);
    lane_mover->SetScheduler(&scheduler);
    scheduler.SetBlockMover(lane_mover.get());
    spdlog::info("decode worker: KV storage of its own ({} blocks); handoffs move pages over {}",
                 (*model)->decode_kv_blocks(), absl::GetFlag(FLAGS_kv_transport));
  }

  // Several daemons: the KV transport, and the link to the decode peers.
  std::unique_ptr<server::KvEndpoint> kv_endpoint;
  if (role != "unified") {
    absl::StatusOr<server::KvEndpoint> endpoint =
        server::StartKvEndpoint((*model)->kv_backend(), absl::GetFlag(FLAGS_kv_transport));
    if (!endpoint.ok()) {
      spdlog::error("cannot start the KV transport: {}", endpoint.status().ToString());
      return 1;
    }
    kv_endpoint = std::make_unique<server::KvEndpoint>(*std::move(endpoint));
    spdlog::info("KV transport: {} over {} ({} MiB of KV pages registered)",
                 kv_endpoint->agent->backend(), absl::GetFlag(FLAGS_kv_transport),
                 (static_cast<int64_t>(kv_endpoint->shape.blocks) *
                  static_cast<int64_t>(kv_endpoint->shape.BytesPerBlock())) >>
                     20);
  }

  server::ServiceOptions service_options;
  service_options.defaults = defaults;
  service_options.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  service_options.default_deadline = absl::GetFlag(FLAGS_default_deadline);
  service_options.slow_reader_timeout = absl::GetFlag(FLAGS_slow_reader_timeout);
  if (service_options.max_prompt_tokens < 0) {
    spdlog::error("--max_prompt_tokens must be >= 0");
    return 2;
  }
  for (const auto& [flag, value] :
       {std::pair{"--default_deadline", service_options.default_deadline},
        std::pair{"--slow_reader_timeout", service_options.slow_reader_timeout}}) {
    if (value < absl::ZeroDuration()) {
      spdlog::error("{} must be >= 0 (got {})", flag, absl::FormatDuration(value));
      return 2;
    }
  }
  std::shared_ptr<const server::ApiKeys> api_keys;
  if (const std::string keys = absl::GetFlag(FLAGS_api_keys_file); !keys.empty()) {
    absl::StatusOr<std::vector<std::string>> read = server::ReadApiKeys(keys);
    if (!read.ok()) {
      spdlog::error("{}", read.status().ToString());
      return 2;
    }
    api_keys = std::make_shared<const server::ApiKeys>(*std::move(read));
    spdlog::info("API keys: {} accepted (from {})", api_keys->size(), keys);
  }
  service_options.accepts_prompts = role != "decode";
  service_options.model_info = (*model)->Info();
  service_options.model_info.set_disagg_output_threshold(hands_off ? *threshold : -1);
  service_options.model_info.set_disagg_output_threshold_auto(auto_threshold);
  service_options.model_info.set_speculative(absl::GetFlag(FLAGS_speculative));
  server::GenerationService service(model->get(), &scheduler, &metrics, service_options);

  std::unique_ptr<server::PeerService> peer_service;
  if (role == "decode") {
    peer_service = std::make_unique<server::PeerService>(
        &scheduler, kv_endpoint.get(), &metrics, service.open_calls_counter(),
        [&service] { return service.accepting(); }, peer_options);
  }

  auto scheduler_collector = std::make_shared<server::SchedulerCollector>(
      &scheduler, (*model)->block_size(), hands_off ? *threshold : -1,
      auto_threshold ? std::optional(disagg_costs) : std::nullopt,
      [&service] { return service.open_calls(); });
  std::unique_ptr<prometheus::Exposer> exposer;
  if (const std::string address = absl::GetFlag(FLAGS_metrics_listen); !address.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(address);
      exposer->RegisterCollectable(registry);
      exposer->RegisterCollectable(scheduler_collector);
    } catch (const std::exception& e) {
      spdlog::error("cannot serve metrics on {}: {}", address, e.what());
      return 1;
    }
  }

  server::GrpcServerOptions grpc_options;
  grpc_options.listen = absl::GetFlag(FLAGS_listen);
  grpc_options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  grpc_options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  grpc_options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  grpc_options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  grpc_options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  grpc_options.api_keys = api_keys;
  grpc_options.on_unauthenticated = [&metrics] { metrics.OnUnauthenticated(); };
  if (grpc_options.max_concurrent_streams < 1) {
    spdlog::error("--max_concurrent_streams must be at least 1");
    return 2;
  }
  std::vector<grpc::Service*> services = {&service};
  if (peer_service != nullptr) services.push_back(peer_service.get());
  absl::StatusOr<std::unique_ptr<grpc::Server>> grpc_server =
      server::StartGrpcServer(grpc_options, services);
  if (!grpc_server.ok()) {
    spdlog::error("{}", grpc_server.status().ToString());
    return 2;
  }
  // A prefill daemon finds its peers before it serves (one round of name
  // resolution and GetLoad).
  std::unique_ptr<server::RemoteDecoder> remote_decoder;
  if (role == "prefill") {
    server::RemoteDecoderOptions remote;
    remote.peers = decode_peers;
    remote.load_interval = absl::GetFlag(FLAGS_peer_load_interval);
    remote.api_key = api_keys != nullptr ? api_keys->first() : std::string();
    remote.max_message_bytes = grpc_options.max_message_bytes;
    remote_decoder = std::make_unique<server::RemoteDecoder>(std::move(remote), &scheduler,
                                                             kv_endpoint.get(), &metrics);
    scheduler.SetRemoteDecodeLink(remote_decoder.get());
    spdlog::info("decode peers: {} ready of {}", remote_decoder->ready_peers(),
                 absl::GetFlag(FLAGS_decode_peers));
  }

  grpc::HealthCheckServiceInterface* health = (*grpc_server)->GetHealthCheckService();
  health->SetServingStatus(true);
  spdlog::info(
      "serving tandem.v1.Generation on {}{}; metrics on {}", grpc_options.listen,
      grpc_options.tls_cert_file.empty() ? "" : " (TLS)",
      absl::GetFlag(FLAGS_metrics_listen).empty() ? "(off)" : absl::GetFlag(FLAGS_metrics_listen));

  // Until a signal: report NOT_SERVING while the scheduler stalls (work
  // pending, no step completed for --stall_timeout), SERVING again after.
  const absl::Duration stall_timeout = absl::GetFlag(FLAGS_stall_timeout);
  bool stalled = false;
  while (!shutdown.WaitForNotificationWithTimeout(absl::Seconds(1))) {
    const scheduler::SchedulerLoad load = scheduler.Load();
    const bool now_stalled = scheduler::Stalled(load, absl::Now(), stall_timeout);
    if (now_stalled != stalled) {
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

  // Drain: refuse new work (UNAVAILABLE, so callers retry elsewhere), let the
  // calls in flight finish for up to --drain_timeout, then cancel the rest
  // with UNAVAILABLE; no call is dropped without a status.
  health->SetServingStatus(false);
  service.StopAccepting();
  const absl::Duration drain = absl::GetFlag(FLAGS_drain_timeout);
  spdlog::info("draining {} open call(s) for up to {}", service.open_calls(),
               absl::FormatDuration(drain));
  const absl::Time drain_deadline = absl::Now() + drain;
  while (service.open_calls() > 0 && absl::Now() < drain_deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (const int64_t left = service.open_calls(); left > 0) {
    spdlog::warn("drain timeout: cancelling {} call(s) with UNAVAILABLE", left);
  }
  // From here gRPC's own shutdown may end a call that arrives meanwhile
  // with CANCELLED instead of our UNAVAILABLE (grpc/grpc#41785).
  spdlog::info("drained: shutting down the gRPC server");
  scheduler.Stop();
  (*grpc_server)->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  (*grpc_server)->Wait();
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the Tandem LLM inference serving daemon (docs/operations.md). Flags:");
  // --help lists the daemon's flags (Abseil's default matches only a file
  // named after the binary).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::string_view(file).find("server/") != absl::string_view::npos;
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  // Logs go to stderr (stdout stays free for tools that wrap the daemon).
  if (absl::Status s = tandem::server::ConfigureLogging(absl::GetFlag(FLAGS_log_format)); !s.ok()) {
    std::fprintf(stderr, "tandemd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  return tandem::Main();
}
