#include "server/daemon_options.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <tuple>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/strings.h"
#include "engine/kernels/cpu/matmul.h"
#include "engine/kernels/cpu/product_rates.h"
#include "server/peer_list.h"

// The flags are defined here, and read only by DaemonOptionsFromFlags (and
// LogFormatFlag), so that every check of a flag's value is in this file.

namespace {

// The default model, where scripts/fetch-model puts it.
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
          "llama3.2-1b, qwen2.5-3b, qwen2.5-7b, qwen3-8b, olmoe-1b-7b, smollm2-135m: for speed "
          "measurements)");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address");
ABSL_FLAG(int, http_port, 8000,
          "port of the OpenAI-compatible HTTP API, on --listen's host (0: off)");
ABSL_FLAG(std::string, served_model_name, "",
          "the model's name in the HTTP API (\"\": the model file's name without .gguf)");
ABSL_FLAG(int, http_threads, 2, "threads serving HTTP connections");
ABSL_FLAG(int, http_max_connections, 4096,
          "open HTTP connections at most (more get 503 and are closed)");
ABSL_FLAG(int64_t, http_max_body_bytes, int64_t{8} << 20, "largest HTTP request body (413 above)");
ABSL_FLAG(absl::Duration, http_idle_timeout, absl::Minutes(5),
          "an HTTP connection idle this long between requests is closed");
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
ABSL_FLAG(int, startup_measure_rounds, 5,
          "timed rounds of the step costs measured at start-up (the backend's row curve, the "
          "step-time model's prior, the auto threshold's timings), each figure their median; "
          "fewer start faster with noisier figures; in [1, 50]");
ABSL_FLAG(absl::Duration, decode_step_interval, absl::Milliseconds(40),
          "--policy=threshold: while prompts are being prefilled, decode-worker steps start at "
          "most this often (the inter-token target of disaggregated streams); 0: as soon as "
          "ready");
ABSL_FLAG(double, prefill_min_share, 0.5,
          "--policy=threshold: the least share of time the prefill worker keeps while both "
          "workers have work, when decode steps grow long; in [0, 1)");
ABSL_FLAG(std::string, disagg_output_threshold, "",
          "sets --policy=threshold: hand a request to the decode worker when its output reaches "
          "this many tokens (or earlier when it is known to); 0: every request; off: never (no "
          "decode worker); auto: measured at start-up. Unset with --policy=threshold: 32");
ABSL_FLAG(std::string, policy, "",
          "slo: decode pacing, prompt step sizes and each request's path from the latency "
          "budgets (--slo_ttft, --slo_tpot, a request's latency_budget) and a step-time model "
          "fitted as steps run; threshold: --disagg_output_threshold with fixed pacing "
          "(--decode_step_interval, --prefill_min_share). Default: slo, or threshold when "
          "--disagg_output_threshold is given");
ABSL_FLAG(absl::Duration, slo_ttft, absl::Seconds(1),
          "the time-to-first-token budget of requests that bring none");
ABSL_FLAG(absl::Duration, slo_tpot, absl::Milliseconds(100),
          "the time-per-output-token budget (mean, after the first token) of requests that "
          "bring none");
ABSL_FLAG(std::string, admission, "none",
          "none: queue every request the limits allow; slo: refuse (RESOURCE_EXHAUSTED) a "
          "request whose predicted time to first token passes its budget, before any compute "
          "is spent (for load balancers that retry elsewhere)");
ABSL_FLAG(bool, disagg_on_max_tokens, false,
          "treat max_tokens as the expected output length when nothing better is known");
ABSL_FLAG(absl::Duration, priority_aging, absl::Seconds(10),
          "a waiting request gains one priority level per this long waited (no starvation)");
ABSL_FLAG(std::string, cpu_matmul, "auto",
          "CPU matrix products: f32 (dequantized weights x float activations, the model's own "
          "arithmetic), q16 (activations as 16-bit integers times the exact quants in integer "
          "dot products: AVX-512 VNNI CPUs; logits within ~0.03 of f32's), bf16 (activations "
          "rounded to bfloat16 times the exact quants, summed in float32: AVX-512 BF16 CPUs), q8 "
          "(8-bit activations as llama.cpp does: the fastest, and it changes some greedy "
          "answers), or auto (times f32, q16 and bf16 at start-up and takes the least exact one "
          "that every more exact one needs at least 1.2x the time of; never q8; the choice and "
          "the figures are logged)");
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
ABSL_FLAG(bool, release_sliding_kv, true,
          "models with sliding-window layers (Gemma 2, 3): give those layers' KV pages back "
          "once a sequence is a whole window past them (a unified daemon with one KV storage); "
          "false keeps them, so that prompts diverging from a cached one early still reuse it");
ABSL_FLAG(int, block_size, 16, "tokens per KV block");
ABSL_FLAG(int, context_length, 0, "tokens per sequence (0: the model's context length)");
ABSL_FLAG(int, max_batched_tokens, 128,
          "tokens per step of one worker, all its sequences together (the prefill chunk size)");
ABSL_FLAG(int, max_running, 0,
          "sequences in the running batch (0: 64, or --max_batched_tokens when that is fewer)");
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
          "a chat template FILE.jinja, or a built-in rendering (chatml, llama3); empty: the "
          "model's own template");
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
ABSL_FLAG(std::string, speculative, "suffix",
          "speculative decoding for requests that do not opt out: off, ngram (drafts from the "
          "latest earlier match of the sequence's last tokens), suffix (from the longest earlier "
          "match in the sequence's own text or recent requests' text of its cache salt, following "
          "the copy it is in), or draft (a draft model: --draft_model or --draft_layers)");
ABSL_FLAG(int, spec_max_draft, -1,
          "most tokens a sequence drafts per step; -1: 32 with --speculative=suffix (which drafts "
          "long while a long span is copied), 8 otherwise");
ABSL_FLAG(bool, spec_adaptive, true,
          "choose draft lengths from each sequence's acceptance and the batch's cost (false: "
          "always --spec_max_draft)");
ABSL_FLAG(int64_t, speculation_cache_bytes, int64_t{64} << 20,
          "with --speculative=suffix: bytes of recent requests' text (prompts and outputs) kept "
          "to draft from across requests, per cache salt; the oldest is evicted first, and "
          "--kv_cache_memory_fraction counts it on the CPU; 0: each request drafts from its own "
          "text only");
ABSL_FLAG(double, spec_suffix_length_factor, 2,
          "with --speculative=suffix: a draft is at most this times the tokens its copy agrees "
          "with so far (its match and the tokens followed since); 0: only --spec_max_draft bounds "
          "it");
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
          "daemon's Nth KV transfer (kv_transfer:error@N: it fails half way; "
          "kv_transfer:stall@N:DURATION: its source stops answering for DURATION; "
          "kv_transfer:overread@N: it also asks for a block it was not offered), or from a "
          "prefill daemon's Nth offer on (kv_transfer:stall@N:DURATION: its KV transport answers "
          "no read for DURATION)");
ABSL_FLAG(std::string, role, "unified",
          "unified (prefill and decode here), prefill (hand requests to the decode daemons of "
          "--decode_peers, by --policy), or decode (take requests over from prefill daemons; no "
          "prompts from clients)");
ABSL_FLAG(std::string, decode_peers, "",
          "--role=prefill: the decode daemons, host:port[,host:port...]; a name that resolves "
          "to several addresses (a Kubernetes headless Service) is several peers");
ABSL_FLAG(std::string, kv_transport_ports, "",
          "the TCP ports the KV transport listens on between daemons, LOW-HIGH (one is drawn "
          "from the range; empty: any the system gives), for firewalls and NetworkPolicies");
ABSL_FLAG(std::string, peer_listen, "",
          "--role=decode: serve the Peer service (handoffs from prefill daemons) on this "
          "host:port of its own, with --peer_tls_* (empty: on --listen)");
ABSL_FLAG(std::string, peer_tls_cert, "",
          "PEM certificate this daemon presents to its prefill or decode peers (mutual TLS, "
          "with --peer_tls_key and --peer_tls_ca)");
ABSL_FLAG(std::string, peer_tls_key, "", "PEM private key of --peer_tls_cert");
ABSL_FLAG(std::string, peer_tls_ca, "",
          "PEM CA that every prefill or decode peer's certificate must chain to; a peer "
          "without one, or with another CA's, is refused");
ABSL_FLAG(std::string, kv_transport, "tcp",
          "UCX transports for KV pages between daemons, as UCX_TLS takes them (tcp; rc,cuda_copy "
          "where the hardware has them)");
ABSL_FLAG(absl::Duration, kv_lease, absl::Seconds(30),
          "--role=prefill: how long offered KV pages are held for the decode daemon to read; "
          "after it the request continues here");
ABSL_FLAG(absl::Duration, peer_load_interval, absl::Milliseconds(200),
          "--role=prefill: how often each decode peer's GetLoad is polled");
ABSL_FLAG(std::string, kv_events_endpoint, "",
          "publish the prefix cache's KV events for cache-aware routers on a ZeroMQ PUB socket "
          "bound here (tcp://*:5557, ipc://PATH; empty: off)");
ABSL_FLAG(std::string, kv_events_replay_endpoint, "",
          "with --kv_events_endpoint: a ZeroMQ ROUTER socket bound here answers requests for "
          "missed KV event messages by sequence number (empty: none)");
ABSL_FLAG(std::string, kv_events_topic, "",
          "the KV events' topic (default kv@<--listen, a wildcard host replaced by the host "
          "name>@<served model name>)");
ABSL_FLAG(int, kv_events_replay_messages, 10000, "KV event messages the replay socket keeps");

namespace tandem::server {
namespace {

// --max_running=0: this many sequences, or --max_batched_tokens if fewer.
constexpr int kDefaultMaxRunning = 64;

absl::Status FlagError(std::string message) {
  return absl::InvalidArgumentError(std::move(message));
}

// The message of `status` as a flag error, after `prefix` (the flag the
// message came from, where the message itself does not say).
absl::Status Prefixed(std::string_view prefix, const absl::Status& status) {
  return FlagError(StrCat(prefix, status.message()));
}

absl::StatusOr<Role> ParseRole(const std::string& role) {
  if (role == "unified") return Role::kUnified;
  if (role == "prefill") return Role::kPrefill;
  if (role == "decode") return Role::kDecode;
  return FlagError(StrCat("--role='", role, "': expected unified, prefill or decode"));
}

// --role and --decode_peers.
absl::Status ReadRole(DaemonOptions& options) {
  absl::StatusOr<Role> role = ParseRole(absl::GetFlag(FLAGS_role));
  if (!role.ok()) return role.status();
  options.role = *role;
  const std::string peers = absl::GetFlag(FLAGS_decode_peers);
  if (options.role == Role::kPrefill) {
    absl::StatusOr<std::vector<std::string>> parsed = ParsePeerList(peers);
    if (!parsed.ok()) return Prefixed("--role=prefill: ", parsed.status());
    options.pool.decode_peers = *std::move(parsed);
  } else if (!peers.empty()) {
    return FlagError(StrCat("--decode_peers is for --role=prefill (this daemon has --role=",
                            RoleName(options.role), ")"));
  }
  options.pool.kv_transport = absl::GetFlag(FLAGS_kv_transport);
  PoolOptions& pool = options.pool;
  pool.kv_transport_ports = absl::GetFlag(FLAGS_kv_transport_ports);
  if (!pool.kv_transport_ports.empty()) {
    const std::vector<std::string> bounds = absl::StrSplit(pool.kv_transport_ports, '-');
    int low = 0, high = 0;
    if (bounds.size() != 2 || !absl::SimpleAtoi(bounds[0], &low) ||
        !absl::SimpleAtoi(bounds[1], &high) || low < 1 || high > 65535 || low > high) {
      return FlagError(StrCat("--kv_transport_ports='", pool.kv_transport_ports,
                              "': expected LOW-HIGH, ports with 1 <= LOW <= HIGH <= 65535"));
    }
    if (options.role == Role::kUnified) {
      return FlagError("--kv_transport_ports is for --role=prefill and --role=decode");
    }
  }
  pool.peer_listen = absl::GetFlag(FLAGS_peer_listen);
  if (!pool.peer_listen.empty() && options.role != Role::kDecode) {
    return FlagError(StrCat("--peer_listen is for --role=decode (this daemon has --role=",
                            RoleName(options.role), ")"));
  }
  pool.peer_tls_cert = absl::GetFlag(FLAGS_peer_tls_cert);
  pool.peer_tls_key = absl::GetFlag(FLAGS_peer_tls_key);
  pool.peer_tls_ca = absl::GetFlag(FLAGS_peer_tls_ca);
  const int tls_files = (pool.peer_tls_cert.empty() ? 0 : 1) + (pool.peer_tls_key.empty() ? 0 : 1) +
                        (pool.peer_tls_ca.empty() ? 0 : 1);
  if (tls_files != 0) {
    if (tls_files != 3) {
      return FlagError(
          "--peer_tls_cert, --peer_tls_key and --peer_tls_ca go together (mutual TLS)");
    }
    if (options.role == Role::kUnified) {
      return FlagError("--peer_tls_* are for --role=prefill and --role=decode");
    }
    if (options.role == Role::kDecode && pool.peer_listen.empty()) {
      return FlagError(
          "--peer_tls_* on --role=decode need --peer_listen (the Peer service's own port; "
          "--listen's TLS is --tls_*)");
    }
  }
  options.pool.peer_load_interval = absl::GetFlag(FLAGS_peer_load_interval);
  return absl::OkStatus();
}

// --disagg_output_threshold and --disagg_on_max_tokens; decides whether a
// local decode worker exists.
absl::Status ReadDisaggregation(DaemonOptions& options) {
  std::string flag = absl::GetFlag(FLAGS_disagg_output_threshold);
  std::string policy = absl::GetFlag(FLAGS_policy);
  if (policy.empty()) policy = flag.empty() ? "slo" : "threshold";
  if (policy == "slo") {
    if (!flag.empty()) {
      return FlagError(StrCat("--disagg_output_threshold=", flag,
                              " goes with --policy=threshold, not --policy=slo (the SLO policy "
                              "picks each request's path from its latency budget)"));
    }
    if (absl::GetFlag(FLAGS_disagg_on_max_tokens)) {
      return FlagError("--disagg_on_max_tokens goes with --policy=threshold, not --policy=slo");
    }
    options.scheduler.slo_policy = true;
    options.dispatch.policy = scheduler::DispatchPolicy::kSlo;
    options.model.decode_worker = options.role == Role::kUnified;
    return absl::OkStatus();
  }
  if (policy != "threshold") {
    return FlagError(StrCat("--policy='", policy, "': expected slo or threshold"));
  }
  options.dispatch.policy = scheduler::DispatchPolicy::kPaced;
  if (flag.empty()) flag = "32";
  options.auto_threshold = flag == "auto";
  if (flag != "off" && !options.auto_threshold) {
    int32_t value = 0;
    if (!absl::SimpleAtoi(flag, &value) || value < 0) {
      return FlagError(StrCat("--disagg_output_threshold='", flag,
                              "': expected a token count >= 0, 'auto' or 'off'"));
    }
    options.output_threshold = value;
  }
  // A prefill daemon hands decoding to its peers, a decode daemon only
  // decodes: either way one worker takes all the compute here.
  options.model.decode_worker = flag != "off" && options.role == Role::kUnified;
  if (options.role == Role::kPrefill && flag == "off") {
    return FlagError(
        "--role=prefill needs --disagg_output_threshold (a token count or auto), not off");
  }
  options.scheduler.disaggregation.use_max_tokens = absl::GetFlag(FLAGS_disagg_on_max_tokens);
  return absl::OkStatus();
}

// The model, its device and its workers' compute.
absl::Status ReadModel(DaemonOptions& options) {
  ServingModelOptions& model = options.model;
  absl::StatusOr<kernels::cpu::MatMulMode> matmul =
      kernels::cpu::ParseMatMulMode(absl::GetFlag(FLAGS_cpu_matmul));
  if (!matmul.ok()) return Prefixed("--cpu_matmul: ", matmul.status());
  model.matmul_mode = *matmul;
  if (absl::GetFlag(FLAGS_cpu_matmul) == "auto") {
    model.matmul_mode_reason = kernels::cpu::AutoMatMulMode().reason;
  }
  model.device = options.device.device;
  model.step_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  model.cuda_decode_sms = absl::GetFlag(FLAGS_cuda_decode_sms);
  if (model.cuda_decode_sms < -1) {
    return FlagError(StrCat("--cuda_decode_sms=", model.cuda_decode_sms,
                            ": expected -1 (auto), 0 (off) or a count of SMs"));
  }
  model.model_path = absl::GetFlag(FLAGS_model);
  model.chat_template = absl::GetFlag(FLAGS_chat_template);
  model.threads = absl::GetFlag(FLAGS_threads);
  model.decode_reserved_threads = absl::GetFlag(FLAGS_decode_reserved_threads);
  model.pin_threads = absl::GetFlag(FLAGS_pin_threads);
  model.measure_rounds = absl::GetFlag(FLAGS_startup_measure_rounds);
  if (absl::Status s = CheckMeasureRounds(model.measure_rounds); !s.ok()) return s;
  if (model.threads < 0) {
    return FlagError(StrCat("--threads=", model.threads, ": must be >= 0 (0: one per CPU)"));
  }
  model.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  model.kv_cache_memory_fraction = absl::GetFlag(FLAGS_kv_cache_memory_fraction);
  if (!(model.kv_cache_memory_fraction >= 0.0 && model.kv_cache_memory_fraction < 1.0)) {
    return FlagError(StrCat("--kv_cache_memory_fraction=", model.kv_cache_memory_fraction,
                            ": must be in [0, 1) (0: use --kv_cache_bytes)"));
  }
  model.decode_kv_cache_bytes = absl::GetFlag(FLAGS_decode_kv_cache_bytes);
  if (model.decode_kv_cache_bytes < 0 ||
      (model.decode_kv_cache_bytes > 0 && !model.decode_worker)) {
    return FlagError(StrCat("--decode_kv_cache_bytes=", model.decode_kv_cache_bytes,
                            ": needs a decode worker (--role=unified, --disagg_output_threshold "
                            "not off) and a size >= 0"));
  }
  model.block_size = absl::GetFlag(FLAGS_block_size);
  if (model.block_size < 1) {
    return FlagError(StrCat("--block_size=", model.block_size, ": must be at least 1"));
  }
  model.context_length = absl::GetFlag(FLAGS_context_length);
  if (model.context_length < 0) {
    return FlagError(
        StrCat("--context_length=", model.context_length, ": must be >= 0 (0: the model's)"));
  }
  return absl::OkStatus();
}

// Speculative decoding: the proposer and the draft model.
absl::Status ReadSpeculation(DaemonOptions& options) {
  ServingModelOptions& model = options.model;
  model.ngram_min = absl::GetFlag(FLAGS_ngram_min);
  model.ngram_max = absl::GetFlag(FLAGS_ngram_max);
  model.draft_layers = absl::GetFlag(FLAGS_draft_layers);
  model.draft_model_path = absl::GetFlag(FLAGS_draft_model);
  scheduler::SpeculationOptions& speculation = options.scheduler.speculation;
  options.speculative = absl::GetFlag(FLAGS_speculative);
  if (options.speculative == "ngram") {
    speculation.proposer = step::Proposer::kNgram;
  } else if (options.speculative == "suffix") {
    speculation.proposer = step::Proposer::kSuffix;
  } else if (options.speculative == "draft") {
    speculation.proposer = step::Proposer::kDraftModel;
    if (model.draft_layers <= 0 && model.draft_model_path.empty()) {
      return FlagError(
          "--speculative=draft needs a draft model: set --draft_model or --draft_layers");
    }
  } else if (options.speculative == "off") {
    speculation.proposer = step::Proposer::kNone;
  } else {
    return FlagError(
        StrCat("--speculative='", options.speculative, "': expected off, ngram, suffix or draft"));
  }
  speculation.max_draft = absl::GetFlag(FLAGS_spec_max_draft);
  if (speculation.max_draft < -1) {
    return FlagError(StrCat("--spec_max_draft must be >= 0, or -1 for the proposer's default (got ",
                            speculation.max_draft, ")"));
  }
  if (speculation.max_draft == -1) {
    speculation.max_draft = speculation.proposer == step::Proposer::kSuffix ? 32 : 8;
  }
  speculation.adaptive = absl::GetFlag(FLAGS_spec_adaptive);
  const int64_t cache_bytes = absl::GetFlag(FLAGS_speculation_cache_bytes);
  if (cache_bytes < 0) {
    return FlagError(StrCat("--speculation_cache_bytes=", cache_bytes, ": must be >= 0"));
  }
  // The cache is kept (and its memory taken) only where it is read.
  model.speculation_cache_bytes = speculation.proposer == step::Proposer::kSuffix ? cache_bytes : 0;
  model.suffix_length_factor = absl::GetFlag(FLAGS_spec_suffix_length_factor);
  if (absl::Status s = CheckSuffixLengthFactor(model.suffix_length_factor); !s.ok()) return s;
  return absl::OkStatus();
}

// The scheduler's own limits and the decode pacing.
absl::Status ReadScheduling(DaemonOptions& options) {
  scheduler::SchedulerOptions& sched = options.scheduler;
  sched.max_batched_tokens = absl::GetFlag(FLAGS_max_batched_tokens);
  if (sched.max_batched_tokens < 1) {
    return FlagError(
        StrCat("--max_batched_tokens=", sched.max_batched_tokens, ": must be at least 1"));
  }
  // Every running sequence's decode must fit in one step: a step plans the
  // decodes first, so with more of them than a step's tokens the ones past
  // the budget would wait step after step and no prompt chunk would get in.
  const int running = absl::GetFlag(FLAGS_max_running);
  if (running < 0) {
    return FlagError(StrCat("--max_running=", running,
                            ": must be >= 0 (0: 64, or --max_batched_tokens when fewer)"));
  }
  if (running > sched.max_batched_tokens) {
    return FlagError(StrCat("--max_running=", running,
                            " is above --max_batched_tokens=", sched.max_batched_tokens,
                            ": each step decodes every running sequence, so it holds at most "
                            "--max_batched_tokens of them"));
  }
  sched.max_running =
      running > 0 ? running : std::min(kDefaultMaxRunning, sched.max_batched_tokens);
  sched.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  options.release_sliding_kv = absl::GetFlag(FLAGS_release_sliding_kv);
  sched.priority_aging = absl::GetFlag(FLAGS_priority_aging);
  sched.remote_decode = options.role == Role::kPrefill;
  sched.kv_lease = absl::GetFlag(FLAGS_kv_lease);
  if (sched.kv_lease <= absl::ZeroDuration())
    return FlagError(
        StrCat("--kv_lease must be > 0 (got ", absl::FormatDuration(sched.kv_lease), ")"));
  sched.max_queued_tokens = absl::GetFlag(FLAGS_max_queued_tokens);
  if (sched.max_queued_tokens < 0) {
    return FlagError(StrCat("--max_queued_tokens must be >= 0 (0: no limit; got ",
                            sched.max_queued_tokens, ")"));
  }
  options.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  if (options.max_queued_requests < 1) {
    return FlagError(
        StrCat("--max_queued_requests=", options.max_queued_requests, ": must be at least 1"));
  }
  scheduler::DecodePacingOptions& pacing = options.dispatch.pacing;
  pacing.interval = absl::GetFlag(FLAGS_decode_step_interval);
  pacing.prefill_min_share = absl::GetFlag(FLAGS_prefill_min_share);
  if (absl::Status s = scheduler::ValidatePacing(pacing); !s.ok())
    return FlagError(std::string(s.message()));
  if (options.dispatch.policy == scheduler::DispatchPolicy::kSlo &&
      (pacing.interval != scheduler::DecodePacingOptions{}.interval ||
       pacing.prefill_min_share != scheduler::DecodePacingOptions{}.prefill_min_share)) {
    return FlagError(
        "--decode_step_interval and --prefill_min_share go with --policy=threshold; "
        "--policy=slo paces decode steps by the streams' --slo_tpot");
  }
  // Reserved decode threads share nothing with prefill: nothing to pace.
  if (options.model.decode_reserved_threads > 0) {
    pacing = {absl::ZeroDuration(), 0.0};
    options.dispatch.shared_compute = false;
  }
  return absl::OkStatus();
}

// The latency budget of requests without one, and SLO admission.
absl::Status ReadSlo(DaemonOptions& options) {
  scheduler::LatencyBudget& slo = options.scheduler.slo;
  slo.ttft = absl::GetFlag(FLAGS_slo_ttft);
  slo.tpot = absl::GetFlag(FLAGS_slo_tpot);
  for (const auto& [flag, value] :
       {std::pair{"--slo_ttft", slo.ttft}, std::pair{"--slo_tpot", slo.tpot}}) {
    if (value <= absl::ZeroDuration() || value > scheduler::MaxLatencyBudget()) {
      return FlagError(StrCat(flag, "=", absl::FormatDuration(value), ": must be in (0, ",
                              absl::FormatDuration(scheduler::MaxLatencyBudget()), "]"));
    }
  }
  const std::string admission = absl::GetFlag(FLAGS_admission);
  if (admission != "none" && admission != "slo") {
    return FlagError(StrCat("--admission='", admission, "': expected none or slo"));
  }
  options.admission_by_slo = admission == "slo";
  return absl::OkStatus();
}

// What the front end applies to requests.
absl::Status ReadRequestPolicy(DaemonOptions& options) {
  RequestPolicy& policy = options.requests;
  policy.defaults.max_tokens = absl::GetFlag(FLAGS_max_tokens_default);
  policy.defaults.temperature = static_cast<float>(absl::GetFlag(FLAGS_default_temperature));
  policy.defaults.top_p = static_cast<float>(absl::GetFlag(FLAGS_default_top_p));
  policy.defaults.top_k = absl::GetFlag(FLAGS_default_top_k);
  if (absl::Status s = ValidateDefaults(policy.defaults); !s.ok())
    return FlagError(std::string(s.message()));
  policy.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  if (policy.max_prompt_tokens < 0)
    return FlagError(
        StrCat("--max_prompt_tokens must be >= 0 (got ", policy.max_prompt_tokens, ")"));
  policy.default_deadline = absl::GetFlag(FLAGS_default_deadline);
  policy.slow_reader_timeout = absl::GetFlag(FLAGS_slow_reader_timeout);
  for (const auto& [flag, value] :
       {std::pair{"--default_deadline", policy.default_deadline},
        std::pair{"--slow_reader_timeout", policy.slow_reader_timeout}}) {
    if (value < absl::ZeroDuration()) {
      return FlagError(StrCat(flag, " must be >= 0 (got ", absl::FormatDuration(value), ")"));
    }
  }
  return absl::OkStatus();
}

// The HTTP API: on --listen's host, with the same TLS files.
absl::Status ReadHttp(ListenOptions& listen) {
  const int port = absl::GetFlag(FLAGS_http_port);
  if (port < 0 || port > 65535) {
    return FlagError(StrCat("--http_port=", port, ": must be a port number (0: off)"));
  }
  listen.http_enabled = port != 0;
  HttpServerOptions& http = listen.http;
  http.port = port;
  http.host = ListenHost(listen.grpc.listen);
  http.tls_cert_file = listen.grpc.tls_cert_file;
  http.tls_key_file = listen.grpc.tls_key_file;
  http.threads = absl::GetFlag(FLAGS_http_threads);
  if (http.threads < 1) {
    return FlagError(StrCat("--http_threads=", http.threads, ": must be at least 1"));
  }
  http.max_connections = absl::GetFlag(FLAGS_http_max_connections);
  if (http.max_connections < 1) {
    return FlagError(
        StrCat("--http_max_connections=", http.max_connections, ": must be at least 1"));
  }
  http.max_body_bytes = absl::GetFlag(FLAGS_http_max_body_bytes);
  if (http.max_body_bytes < 1) {
    return FlagError(StrCat("--http_max_body_bytes=", http.max_body_bytes, ": must be at least 1"));
  }
  http.idle_timeout = absl::GetFlag(FLAGS_http_idle_timeout);
  if (http.idle_timeout <= absl::ZeroDuration()) {
    return FlagError(
        StrCat("--http_idle_timeout=", absl::FormatDuration(http.idle_timeout), ": must be > 0"));
  }
  listen.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  return absl::OkStatus();
}

// Addresses, TLS and API keys.
absl::Status ReadListen(DaemonOptions& options) {
  ListenOptions& listen = options.listen;
  GrpcServerOptions& grpc = listen.grpc;
  grpc.listen = absl::GetFlag(FLAGS_listen);
  listen.metrics = absl::GetFlag(FLAGS_metrics_listen);
  grpc.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  grpc.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  grpc.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  grpc.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (grpc.max_message_bytes < 1) {
    return FlagError(
        StrCat("--max_message_bytes=", grpc.max_message_bytes, ": must be at least 1"));
  }
  grpc.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  if (grpc.max_concurrent_streams < 1) {
    return FlagError(StrCat("--max_concurrent_streams must be at least 1 (got ",
                            grpc.max_concurrent_streams, ")"));
  }
  if (absl::Status s = ReadHttp(listen); !s.ok()) return s;
  listen.http.write_timeout = options.requests.slow_reader_timeout;
  listen.api_keys_file = absl::GetFlag(FLAGS_api_keys_file);
  if (!listen.api_keys_file.empty()) {
    absl::StatusOr<std::vector<std::string>> keys = ReadApiKeys(listen.api_keys_file);
    if (!keys.ok()) return FlagError(std::string(keys.status().message()));
    grpc.api_keys = std::make_shared<const ApiKeys>(*std::move(keys));
  }
  return absl::OkStatus();
}

// --kv_events_*.
absl::Status ReadKvEvents(DaemonOptions& options) {
  KvEventsOptions& events = options.kv_events;
  events.endpoint = absl::GetFlag(FLAGS_kv_events_endpoint);
  events.replay_endpoint = absl::GetFlag(FLAGS_kv_events_replay_endpoint);
  events.topic = absl::GetFlag(FLAGS_kv_events_topic);
  events.replay_messages = absl::GetFlag(FLAGS_kv_events_replay_messages);
  for (const auto& [flag, endpoint] :
       {std::pair{"--kv_events_endpoint", events.endpoint},
        std::pair{"--kv_events_replay_endpoint", events.replay_endpoint}}) {
    if (!endpoint.empty() && !absl::StartsWith(endpoint, "tcp://") &&
        !absl::StartsWith(endpoint, "ipc://")) {
      return FlagError(StrCat(flag, "='", endpoint,
                              "': expected a ZeroMQ endpoint, tcp://HOST:PORT or ipc://PATH"));
    }
  }
  if (events.endpoint.empty() && (!events.replay_endpoint.empty() || !events.topic.empty())) {
    return FlagError(
        "--kv_events_replay_endpoint and --kv_events_topic go with --kv_events_endpoint");
  }
  if (events.replay_messages < 1 || events.replay_messages > 1000000) {
    return FlagError(StrCat("--kv_events_replay_messages=", events.replay_messages,
                            ": must be in [1, 1000000]"));
  }
  return absl::OkStatus();
}

// --inject_fault: which worker (or KV transfer) fails, and how.
absl::Status ReadFault(DaemonOptions& options) {
  const std::string fault = absl::GetFlag(FLAGS_inject_fault);
  if (fault.empty()) return absl::OkStatus();
  absl::StatusOr<scheduler::FaultSpec> spec = scheduler::ParseFaultSpec(fault);
  if (!spec.ok()) return FlagError(std::string(spec.status().message()));
  if (spec->lane == "kv_transfer") {
    const bool decode_fault =
        options.role == Role::kDecode && spec->kind != scheduler::FaultSpec::Kind::kThrow;
    const bool prefill_fault =
        options.role == Role::kPrefill && spec->kind == scheduler::FaultSpec::Kind::kStall;
    if (!decode_fault && !prefill_fault) {
      return FlagError(StrCat("--inject_fault='", fault,
                              "': kv_transfer takes error@N, stall@N:DURATION or overread@N on "
                              "a --role=decode daemon, stall@N:DURATION on a --role=prefill one"));
    }
  } else if (spec->kind == scheduler::FaultSpec::Kind::kOverread) {
    return FlagError(StrCat("--inject_fault='", fault, "': overread is for kv_transfer"));
  } else if (spec->lane == "decode" && !options.model.decode_worker) {
    return FlagError(StrCat("--inject_fault='", fault, "': there is no decode worker"));
  }
  options.fault = *spec;
  return absl::OkStatus();
}

}  // namespace

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kUnified:
      return "unified";
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
  }
  return "unknown";
}

std::string ListenHost(std::string_view listen) {
  std::string_view host = listen.substr(0, listen.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return "127.0.0.1";
  if (host.empty()) return "0.0.0.0";
  return std::string(host);
}

std::string LogFormatFlag() { return absl::GetFlag(FLAGS_log_format); }

absl::StatusOr<DaemonOptions> DaemonOptionsFromFlags(
    const absl::StatusOr<kernels::cuda::CudaProbe>& cuda) {
  DaemonOptions options;
  absl::StatusOr<kernels::DeviceChoice> device =
      kernels::ChooseDevice(absl::GetFlag(FLAGS_device), cuda);
  if (!device.ok()) return FlagError(std::string(device.status().message()));
  options.device = *std::move(device);
  // In this order: the role decides the threshold's meaning, and both decide
  // whether a decode worker exists, which later checks depend on.
  for (absl::Status (*read)(DaemonOptions&) :
       {ReadRole, ReadDisaggregation, ReadModel, ReadSpeculation, ReadScheduling, ReadSlo,
        ReadRequestPolicy, ReadListen, ReadKvEvents, ReadFault}) {
    if (absl::Status s = read(options); !s.ok()) return s;
  }
  options.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  options.stall_timeout = absl::GetFlag(FLAGS_stall_timeout);
  for (const auto& [flag, value, zero_allowed] :
       {std::tuple{"--drain_timeout", options.drain_timeout, true},
        std::tuple{"--stall_timeout", options.stall_timeout, false},
        std::tuple{"--peer_load_interval", options.pool.peer_load_interval, false},
        std::tuple{"--priority_aging", options.scheduler.priority_aging, true}}) {
    if (value < absl::ZeroDuration() || (!zero_allowed && value == absl::ZeroDuration())) {
      return FlagError(StrCat(flag, "=", absl::FormatDuration(value), ": must be ",
                              zero_allowed ? ">= 0" : "> 0"));
    }
  }
  return options;
}

}  // namespace tandem::server
