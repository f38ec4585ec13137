// DaemonOptionsFromFlags: every flag value it can judge without the model
// file is refused here, before anything starts, with INVALID_ARGUMENT naming
// the flag; accepted values land in the fields the daemon is assembled from. Flags are set as
// the command line would set them (by name, from text), with a FlagSaver per
// test restoring the defaults.
#include "server/daemon_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"

namespace tandem::server {
namespace {

using ::testing::HasSubstr;

using FlagValues = std::vector<std::pair<std::string, std::string>>;

// What probing the CUDA module finds on a machine without it.
absl::StatusOr<kernels::cuda::CudaProbe> NoCudaModule() {
  return absl::NotFoundError("no CUDA module here (test)");
}

void SetFlags(const FlagValues& values) {
  for (const auto& [name, value] : values) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    ASSERT_NE(flag, nullptr) << "no flag --" << name;
    std::string error;
    ASSERT_TRUE(flag->ParseFrom(value, &error)) << "--" << name << "=" << value << ": " << error;
  }
}

absl::StatusOr<DaemonOptions> OptionsWith(const FlagValues& values) {
  SetFlags(values);
  return DaemonOptionsFromFlags(NoCudaModule());
}

std::string TempFile(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + "/daemon_options_test_" + name;
  std::ofstream(path) << contents;
  return path;
}

TEST(DaemonOptionsTest, TheDefaultsAreAUnifiedDaemonWithADecodeWorkerUnderTheSloPolicy) {
  absl::FlagSaver saver;
  absl::StatusOr<DaemonOptions> options = OptionsWith({});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->role, Role::kUnified);
  EXPECT_EQ(options->device.device, kernels::Device::kCpu);  // auto, without a CUDA module
  EXPECT_FALSE(options->output_threshold.has_value());       // the SLO policy picks paths
  EXPECT_FALSE(options->auto_threshold);
  EXPECT_TRUE(options->scheduler.slo_policy);
  EXPECT_TRUE(options->kv_events.endpoint.empty());  // no KV events unless asked
  EXPECT_EQ(options->dispatch.policy, scheduler::DispatchPolicy::kSlo);
  EXPECT_TRUE(options->dispatch.shared_compute);
  EXPECT_EQ(options->scheduler.slo.ttft, absl::Seconds(1));
  EXPECT_EQ(options->scheduler.slo.tpot, absl::Milliseconds(100));
  EXPECT_FALSE(options->admission_by_slo);
  EXPECT_TRUE(options->model.decode_worker);
  EXPECT_EQ(options->model.block_size, 16);
  EXPECT_EQ(options->model.kv_cache_bytes, int64_t{512} << 20);
  EXPECT_EQ(options->scheduler.max_batched_tokens, 128);
  EXPECT_EQ(options->scheduler.max_running, 64);
  EXPECT_FALSE(options->scheduler.remote_decode);
  EXPECT_EQ(options->scheduler.speculation.proposer, step::Proposer::kSuffix);
  EXPECT_EQ(options->speculative, "suffix");
  EXPECT_EQ(options->scheduler.speculation.max_draft, 32);
  EXPECT_EQ(options->model.speculation_cache_bytes, int64_t{64} << 20);
  EXPECT_EQ(options->dispatch.pacing.interval, absl::Milliseconds(40));
  EXPECT_EQ(options->dispatch.pacing.prefill_min_share, 0.5);
  EXPECT_EQ(options->max_queued_requests, 256);
  EXPECT_EQ(options->requests.defaults.max_tokens, 2048);
  EXPECT_EQ(options->requests.default_deadline, absl::Minutes(10));
  EXPECT_EQ(options->listen.grpc.listen, "127.0.0.1:50051");
  EXPECT_EQ(options->listen.metrics, "127.0.0.1:9400");
  EXPECT_EQ(options->listen.grpc.api_keys, nullptr);
  EXPECT_FALSE(options->fault.has_value());
  EXPECT_EQ(options->drain_timeout, absl::Seconds(30));
}

// Every flag set to a value unlike its default and unlike the others of its
// kind: each lands in its own field (a swap of two reads fails here).
TEST(DaemonOptionsTest, EveryFlagLandsInItsOwnField) {
  absl::FlagSaver saver;
  const std::string keys = TempFile("keys_all", "only-key\n");
  absl::StatusOr<DaemonOptions> o = OptionsWith({
      {"model", "/m/model.gguf"},
      {"listen", "127.0.0.1:1111"},
      {"metrics_listen", "127.0.0.1:2222"},
      {"device", "cpu"},
      {"cuda_graphs", "false"},
      {"cuda_decode_sms", "7"},
      {"threads", "3"},
      {"pin_threads", "false"},
      {"policy", "threshold"},
      {"slo_ttft", "2500ms"},
      {"slo_tpot", "70ms"},
      {"admission", "slo"},
      {"decode_step_interval", "17ms"},
      {"prefill_min_share", "0.25"},
      {"disagg_output_threshold", "48"},
      {"disagg_on_max_tokens", "true"},
      {"priority_aging", "11s"},
      {"cpu_matmul", "f32"},
      {"kv_cache_bytes", "123456789"},
      {"decode_kv_cache_bytes", "98765432"},
      {"kv_cache_memory_fraction", "0.125"},
      {"prefix_caching", "false"},
      {"block_size", "32"},
      {"context_length", "1024"},
      {"max_batched_tokens", "96"},
      {"max_running", "12"},
      {"max_queued_requests", "34"},
      {"max_queued_tokens", "5678"},
      {"max_prompt_tokens", "900"},
      {"max_concurrent_streams", "9"},
      {"default_deadline", "3m"},
      {"slow_reader_timeout", "45s"},
      {"max_tokens_default", "77"},
      {"default_temperature", "0.5"},
      {"default_top_p", "0.75"},
      {"default_top_k", "13"},
      {"chat_template", "llama3"},
      {"drain_timeout", "19s"},
      {"stall_timeout", "23s"},
      {"tls_cert", "/tls/cert.pem"},
      {"tls_key", "/tls/key.pem"},
      {"tls_client_ca", "/tls/ca.pem"},
      {"api_keys_file", keys},
      {"max_message_bytes", "1048576"},
      {"speculative", "off"},
      {"spec_max_draft", "6"},
      {"spec_adaptive", "false"},
      {"ngram_min", "2"},
      {"ngram_max", "5"},
      {"draft_model", "/m/draft.gguf"},
      {"draft_layers", "3"},
      {"startup_measure_rounds", "2"},
      {"inject_fault", "prefill:throw@4"},
      {"kv_transport", "rc,cuda_copy"},
      {"kv_lease", "7s"},
      {"peer_load_interval", "350ms"},
      {"log_format", "json"},
      {"kv_events_endpoint", "tcp://*:5557"},
      {"kv_events_replay_endpoint", "ipc:///run/tandem/replay"},
      {"kv_events_topic", "kv@pod-1:50051@smol"},
      {"kv_events_replay_messages", "77"},
  });
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device.device, kernels::Device::kCpu);
  const ServingModelOptions& m = o->model;
  EXPECT_EQ(m.model_path, "/m/model.gguf");
  EXPECT_EQ(m.device, kernels::Device::kCpu);
  EXPECT_FALSE(m.step_graphs);
  EXPECT_EQ(m.cuda_decode_sms, 7);
  EXPECT_EQ(m.threads, 3);
  EXPECT_EQ(m.decode_reserved_threads, 0);
  EXPECT_FALSE(m.pin_threads);
  EXPECT_TRUE(m.decode_worker);
  EXPECT_EQ(m.matmul_mode, kernels::cpu::MatMulMode::kF32);
  EXPECT_EQ(m.kv_cache_bytes, 123456789);
  EXPECT_EQ(m.decode_kv_cache_bytes, 98765432);
  EXPECT_EQ(m.kv_cache_memory_fraction, 0.125);
  EXPECT_EQ(m.block_size, 32);
  EXPECT_EQ(m.context_length, 1024);
  EXPECT_EQ(m.chat_template, "llama3");
  EXPECT_EQ(m.ngram_min, 2);
  EXPECT_EQ(m.ngram_max, 5);
  EXPECT_EQ(m.draft_model_path, "/m/draft.gguf");
  EXPECT_EQ(m.draft_layers, 3);
  EXPECT_EQ(m.measure_rounds, 2);
  EXPECT_EQ(o->output_threshold, 48);
  const scheduler::SchedulerOptions& sched = o->scheduler;
  EXPECT_TRUE(sched.disaggregation.use_max_tokens);
  EXPECT_EQ(sched.priority_aging, absl::Seconds(11));
  EXPECT_FALSE(sched.prefix_caching);
  EXPECT_EQ(sched.max_batched_tokens, 96);
  EXPECT_EQ(sched.max_running, 12);
  EXPECT_EQ(sched.max_queued_tokens, 5678);
  EXPECT_EQ(sched.kv_lease, absl::Seconds(7));
  EXPECT_EQ(sched.speculation.proposer, step::Proposer::kNone);
  EXPECT_EQ(sched.speculation.max_draft, 6);
  EXPECT_FALSE(sched.speculation.adaptive);
  EXPECT_EQ(o->speculative, "off");
  EXPECT_EQ(o->max_queued_requests, 34);
  EXPECT_EQ(o->dispatch.pacing.interval, absl::Milliseconds(17));
  EXPECT_EQ(o->dispatch.pacing.prefill_min_share, 0.25);
  EXPECT_EQ(o->dispatch.policy, scheduler::DispatchPolicy::kPaced);
  EXPECT_FALSE(o->scheduler.slo_policy);
  EXPECT_EQ(o->scheduler.slo.ttft, absl::Milliseconds(2500));
  EXPECT_EQ(o->scheduler.slo.tpot, absl::Milliseconds(70));
  EXPECT_TRUE(o->admission_by_slo);
  const RequestPolicy& r = o->requests;
  EXPECT_EQ(r.max_prompt_tokens, 900);
  EXPECT_EQ(r.default_deadline, absl::Minutes(3));
  EXPECT_EQ(r.slow_reader_timeout, absl::Seconds(45));
  EXPECT_EQ(r.defaults.max_tokens, 77);
  EXPECT_EQ(r.defaults.temperature, 0.5f);
  EXPECT_EQ(r.defaults.top_p, 0.75f);
  EXPECT_EQ(r.defaults.top_k, 13);
  const GrpcServerOptions& g = o->listen.grpc;
  EXPECT_EQ(g.listen, "127.0.0.1:1111");
  EXPECT_EQ(o->listen.metrics, "127.0.0.1:2222");
  EXPECT_EQ(g.max_concurrent_streams, 9);
  EXPECT_EQ(g.tls_cert_file, "/tls/cert.pem");
  EXPECT_EQ(g.tls_key_file, "/tls/key.pem");
  EXPECT_EQ(g.tls_client_ca, "/tls/ca.pem");
  EXPECT_EQ(g.max_message_bytes, 1048576);
  ASSERT_NE(g.api_keys, nullptr);
  EXPECT_EQ(g.api_keys->first(), "only-key");
  EXPECT_EQ(o->drain_timeout, absl::Seconds(19));
  EXPECT_EQ(o->stall_timeout, absl::Seconds(23));
  ASSERT_TRUE(o->fault.has_value());
  EXPECT_EQ(o->fault->lane, "prefill");
  EXPECT_EQ(o->fault->kind, scheduler::FaultSpec::Kind::kThrow);
  EXPECT_EQ(o->fault->step, 4);
  EXPECT_EQ(o->pool.kv_transport, "rc,cuda_copy");
  EXPECT_EQ(o->pool.peer_load_interval, absl::Milliseconds(350));
  EXPECT_EQ(o->kv_events.endpoint, "tcp://*:5557");
  EXPECT_EQ(o->kv_events.replay_endpoint, "ipc:///run/tandem/replay");
  EXPECT_EQ(o->kv_events.topic, "kv@pod-1:50051@smol");
  EXPECT_EQ(o->kv_events.replay_messages, 77);
  EXPECT_EQ(LogFormatFlag(), "json");
}

TEST(DaemonOptionsTest, TheRoleDecidesWhereDecodingHappens) {
  {
    absl::FlagSaver saver;
    absl::StatusOr<DaemonOptions> prefill =
        OptionsWith({{"role", "prefill"}, {"decode_peers", "dns:///decode:50051, 10.0.0.2:7"}});
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    EXPECT_EQ(prefill->role, Role::kPrefill);
    EXPECT_FALSE(prefill->model.decode_worker);  // the peers decode
    EXPECT_TRUE(prefill->scheduler.remote_decode);
    EXPECT_THAT(prefill->pool.decode_peers, ::testing::ElementsAre("decode:50051", "10.0.0.2:7"));
  }
  {
    absl::FlagSaver saver;
    absl::StatusOr<DaemonOptions> decode = OptionsWith({{"role", "decode"},
                                                        {"kv_transport_ports", "40000-40099"},
                                                        {"peer_listen", "0.0.0.0:50052"},
                                                        {"peer_tls_cert", "/c.pem"},
                                                        {"peer_tls_key", "/k.pem"},
                                                        {"peer_tls_ca", "/ca.pem"}});
    ASSERT_TRUE(decode.ok()) << decode.status();
    EXPECT_FALSE(decode->model.decode_worker);  // one worker takes all the compute
    EXPECT_FALSE(decode->scheduler.remote_decode);
    EXPECT_EQ(decode->pool.kv_transport_ports, "40000-40099");
    EXPECT_EQ(decode->pool.peer_listen, "0.0.0.0:50052");
    EXPECT_EQ(decode->pool.peer_tls_cert, "/c.pem");
    EXPECT_EQ(decode->pool.peer_tls_key, "/k.pem");
    EXPECT_EQ(decode->pool.peer_tls_ca, "/ca.pem");
  }
  {
    absl::FlagSaver saver;
    absl::StatusOr<DaemonOptions> colocated = OptionsWith({{"disagg_output_threshold", "off"}});
    ASSERT_TRUE(colocated.ok()) << colocated.status();
    EXPECT_FALSE(colocated->output_threshold.has_value());
    EXPECT_FALSE(colocated->model.decode_worker);
  }
  {
    absl::FlagSaver saver;
    absl::StatusOr<DaemonOptions> measured = OptionsWith({{"disagg_output_threshold", "auto"}});
    ASSERT_TRUE(measured.ok()) << measured.status();
    EXPECT_TRUE(measured->auto_threshold);
    EXPECT_FALSE(measured->output_threshold.has_value());  // measured at start-up
    EXPECT_TRUE(measured->model.decode_worker);
  }
}

TEST(DaemonOptionsTest, ReservedDecodeThreadsTurnPacingOff) {
  absl::FlagSaver saver;
  absl::StatusOr<DaemonOptions> options =
      OptionsWith({{"threads", "2"}, {"decode_reserved_threads", "1"}});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->dispatch.pacing.interval, absl::ZeroDuration());
  EXPECT_EQ(options->dispatch.pacing.prefill_min_share, 0.0);
  EXPECT_FALSE(options->dispatch.shared_compute);
}

// A step decodes every running sequence, so the running batch is at most a
// step's tokens: unset, it follows --max_batched_tokens down; set, it may
// equal it.
TEST(DaemonOptionsTest, TheRunningBatchFitsInOneStep) {
  for (const auto& [tokens, running, expected] :
       {std::tuple{"7", "0", 7}, std::tuple{"64", "0", 64}, std::tuple{"512", "0", 64},
        std::tuple{"32", "32", 32}, std::tuple{"512", "100", 100}}) {
    SCOPED_TRACE(absl::StrCat(tokens, " ", running));
    absl::FlagSaver saver;
    absl::StatusOr<DaemonOptions> o =
        OptionsWith({{"max_batched_tokens", tokens}, {"max_running", running}});
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->scheduler.max_running, expected);
  }
}

TEST(DaemonOptionsTest, AThresholdChoosesTheThresholdPolicy) {
  for (const std::string threshold : {"off", "0", "17", "auto"}) {
    SCOPED_TRACE(threshold);
    absl::FlagSaver saver;
    absl::StatusOr<DaemonOptions> o = OptionsWith({{"disagg_output_threshold", threshold}});
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_FALSE(o->scheduler.slo_policy);
    EXPECT_EQ(o->dispatch.policy, scheduler::DispatchPolicy::kPaced);
    EXPECT_EQ(o->model.decode_worker, threshold != "off");
  }
  absl::FlagSaver saver;
  absl::StatusOr<DaemonOptions> o = OptionsWith({{"policy", "threshold"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->output_threshold, 32);  // the threshold policy's own default
  EXPECT_EQ(o->dispatch.policy, scheduler::DispatchPolicy::kPaced);
}

TEST(DaemonOptionsTest, SuffixSpeculationDraftsLongFromACacheOfRecentText) {
  absl::FlagSaver saver;
  absl::StatusOr<DaemonOptions> suffix = OptionsWith({{"speculative", "suffix"}});
  ASSERT_TRUE(suffix.ok()) << suffix.status();
  EXPECT_EQ(suffix->scheduler.speculation.proposer, step::Proposer::kSuffix);
  EXPECT_EQ(suffix->scheduler.speculation.max_draft, 32);
  EXPECT_EQ(suffix->model.speculation_cache_bytes, int64_t{64} << 20);
  EXPECT_EQ(suffix->model.suffix_length_factor, 2.0);
  absl::StatusOr<DaemonOptions> set = OptionsWith({{"speculative", "suffix"},
                                                   {"spec_max_draft", "12"},
                                                   {"speculation_cache_bytes", "1048576"},
                                                   {"spec_suffix_length_factor", "0.5"}});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->scheduler.speculation.max_draft, 12);
  EXPECT_EQ(set->model.speculation_cache_bytes, 1048576);
  EXPECT_EQ(set->model.suffix_length_factor, 0.5);
  // The other proposers keep no cache and draft at most 8 by default.
  absl::StatusOr<DaemonOptions> ngram =
      OptionsWith({{"speculative", "ngram"}, {"spec_max_draft", "-1"}});
  ASSERT_TRUE(ngram.ok()) << ngram.status();
  EXPECT_EQ(ngram->scheduler.speculation.proposer, step::Proposer::kNgram);
  EXPECT_EQ(ngram->scheduler.speculation.max_draft, 8);
  EXPECT_EQ(ngram->model.speculation_cache_bytes, 0) << "kept only for suffix drafting";
}

TEST(DaemonOptionsTest, SpeculationAndFaultFlagsBecomeTheirOptions) {
  absl::FlagSaver saver;
  absl::StatusOr<DaemonOptions> options = OptionsWith({{"speculative", "draft"},
                                                       {"draft_layers", "4"},
                                                       {"spec_max_draft", "5"},
                                                       {"spec_adaptive", "false"},
                                                       {"inject_fault", "decode:stall@2:3s"}});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->scheduler.speculation.proposer, step::Proposer::kDraftModel);
  EXPECT_EQ(options->model.draft_layers, 4);
  EXPECT_EQ(options->scheduler.speculation.max_draft, 5);
  EXPECT_FALSE(options->scheduler.speculation.adaptive);
  ASSERT_TRUE(options->fault.has_value());
  EXPECT_EQ(options->fault->lane, "decode");
  EXPECT_EQ(options->fault->kind, scheduler::FaultSpec::Kind::kStall);
  EXPECT_EQ(options->fault->step, 2);
  EXPECT_EQ(options->fault->stall, absl::Seconds(3));
}

TEST(DaemonOptionsTest, TheApiKeysFileIsReadSkippingCommentsAndBlankLines) {
  absl::FlagSaver saver;
  const std::string keys = TempFile("keys", "# the pool's keys\n\n  first-key  \nsecond-key\n");
  absl::StatusOr<DaemonOptions> options = OptionsWith({{"api_keys_file", keys}});
  ASSERT_TRUE(options.ok()) << options.status();
  ASSERT_NE(options->listen.grpc.api_keys, nullptr);
  EXPECT_EQ(options->listen.grpc.api_keys->size(), 2u);
  EXPECT_EQ(options->listen.grpc.api_keys->first(), "first-key");
  EXPECT_EQ(options->listen.api_keys_file, keys);
}

struct BadFlags {
  FlagValues flags;
  std::string message;  // what the error must say (it names the flag)
};

// Every value DaemonOptionsFromFlags refuses: INVALID_ARGUMENT whose message
// names the flag.
TEST(DaemonOptionsTest, EveryRefusedValueNamesItsFlag) {
  const std::string empty_keys = TempFile("empty_keys", "# none yet\n\n");
  const std::vector<BadFlags> cases = {
      {{{"device", "tpu"}}, "--device='tpu': expected auto, cpu or cuda"},
      {{{"device", "cuda"}}, "--device=cuda: "},
      {{{"role", "both"}}, "--role='both': expected unified, prefill or decode"},
      {{{"role", "prefill"}}, "--role=prefill: --decode_peers: no peer given"},
      {{{"role", "prefill"}, {"decode_peers", "peer-without-port"}},
       "--decode_peers: 'peer-without-port' is not host:port"},
      {{{"role", "prefill"}, {"decode_peers", "host:70000"}}, "--decode_peers: 'host:70000'"},
      {{{"decode_peers", "127.0.0.1:1"}},
       "--decode_peers is for --role=prefill (this daemon has --role=unified)"},
      {{{"disagg_output_threshold", "sometimes"}},
       "--disagg_output_threshold='sometimes': expected a token count >= 0, 'auto' or 'off'"},
      {{{"disagg_output_threshold", "-1"}}, "--disagg_output_threshold='-1'"},
      {{{"role", "prefill"}, {"decode_peers", "a:1"}, {"disagg_output_threshold", "off"}},
       "--role=prefill needs --disagg_output_threshold (a token count or auto), not off"},
      {{{"cpu_matmul", "int4"}}, "--cpu_matmul: "},
      {{{"cuda_decode_sms", "-2"}}, "--cuda_decode_sms=-2: expected -1 (auto), 0 (off)"},
      {{{"threads", "-1"}}, "--threads=-1: must be >= 0"},
      {{{"kv_cache_memory_fraction", "1.5"}}, "--kv_cache_memory_fraction=1.5: must be in [0, 1)"},
      {{{"startup_measure_rounds", "0"}}, "--startup_measure_rounds=0: must be in [1, 50]"},
      {{{"role", "decode"}, {"kv_transport_ports", "9-2"}},
       "--kv_transport_ports='9-2': expected LOW-HIGH, ports with 1 <= LOW <= HIGH <= 65535"},
      {{{"role", "decode"}, {"kv_transport_ports", "40000"}},
       "--kv_transport_ports='40000': expected LOW-HIGH"},
      {{{"kv_transport_ports", "40000-40099"}},
       "--kv_transport_ports is for --role=prefill and --role=decode"},
      {{{"kv_events_endpoint", "udp://x:1"}},
       "--kv_events_endpoint='udp://x:1': expected a ZeroMQ endpoint, tcp://HOST:PORT or "
       "ipc://PATH"},
      {{{"kv_events_endpoint", "tcp://*:1"}, {"kv_events_replay_endpoint", "5558"}},
       "--kv_events_replay_endpoint='5558': expected a ZeroMQ endpoint"},
      {{{"kv_events_replay_endpoint", "tcp://*:5558"}},
       "--kv_events_replay_endpoint and --kv_events_topic go with --kv_events_endpoint"},
      {{{"kv_events_endpoint", "tcp://*:1"}, {"kv_events_replay_messages", "0"}},
       "--kv_events_replay_messages=0: must be in [1, 1000000]"},
      {{{"kv_cache_memory_fraction", "-0.25"}}, "--kv_cache_memory_fraction=-0.25: must be in"},
      {{{"decode_kv_cache_bytes", "-1"}}, "--decode_kv_cache_bytes=-1: needs a decode worker"},
      {{{"decode_kv_cache_bytes", "67108864"}, {"disagg_output_threshold", "off"}},
       "--decode_kv_cache_bytes=67108864: needs a decode worker"},
      {{{"decode_kv_cache_bytes", "67108864"}, {"role", "decode"}},
       "--decode_kv_cache_bytes=67108864: needs a decode worker"},
      {{{"block_size", "0"}}, "--block_size=0: must be at least 1"},
      {{{"context_length", "-5"}}, "--context_length=-5: must be >= 0"},
      {{{"speculative", "bogus"}}, "--speculative='bogus': expected off, ngram, suffix or draft"},
      {{{"speculative", "draft"}},
       "--speculative=draft needs a draft model: set --draft_model or --draft_layers"},
      {{{"spec_max_draft", "-2"}},
       "--spec_max_draft must be >= 0, or -1 for the proposer's default (got -2)"},
      {{{"speculation_cache_bytes", "-1"}}, "--speculation_cache_bytes=-1: must be >= 0"},
      {{{"spec_suffix_length_factor", "-0.5"}},
       "--spec_suffix_length_factor=-0.5: must be a finite number >= 0"},
      {{{"spec_suffix_length_factor", "inf"}},
       "--spec_suffix_length_factor=inf: must be a finite number >= 0"},
      {{{"max_batched_tokens", "0"}}, "--max_batched_tokens=0: must be at least 1"},
      {{{"max_running", "-1"}}, "--max_running=-1: must be >= 0 (0: 64, or --max_batched_tokens"},
      {{{"max_running", "129"}},
       "--max_running=129 is above --max_batched_tokens=128: each step decodes every running "
       "sequence, so it holds at most --max_batched_tokens of them"},
      {{{"max_running", "33"}, {"max_batched_tokens", "32"}},
       "--max_running=33 is above --max_batched_tokens=32"},
      {{{"max_queued_requests", "0"}}, "--max_queued_requests=0: must be at least 1"},
      {{{"kv_lease", "0s"}}, "--kv_lease must be > 0 (got 0)"},
      {{{"max_queued_tokens", "-1"}}, "--max_queued_tokens must be >= 0 (0: no limit; got -1)"},
      {{{"decode_step_interval", "-1ms"}}, "--decode_step_interval=-1ms: must be >= 0"},
      {{{"prefill_min_share", "1"}}, "--prefill_min_share=1: must be in [0, 1)"},
      {{{"default_temperature", "-1"}}, "--default_temperature=-1: must be a finite number >= 0"},
      {{{"default_top_p", "0"}}, "--default_top_p=0: must be in (0, 1]"},
      {{{"default_top_k", "-2"}}, "--default_top_k=-2: must be >= 0"},
      {{{"max_tokens_default", "0"}}, "--max_tokens_default=0: must be >= 1"},
      {{{"max_prompt_tokens", "-1"}}, "--max_prompt_tokens must be >= 0 (got -1)"},
      {{{"default_deadline", "-1s"}}, "--default_deadline must be >= 0 (got -1s)"},
      {{{"slow_reader_timeout", "-2s"}}, "--slow_reader_timeout must be >= 0 (got -2s)"},
      {{{"max_concurrent_streams", "0"}}, "--max_concurrent_streams must be at least 1 (got 0)"},
      {{{"max_message_bytes", "0"}}, "--max_message_bytes=0: must be at least 1"},
      {{{"api_keys_file", "/nonexistent/keys"}},
       "--api_keys_file: cannot read '/nonexistent/keys'"},
      {{{"api_keys_file", empty_keys}}, "--api_keys_file: '" + empty_keys + "' holds no keys"},
      {{{"inject_fault", "prefill:explode@3"}},
       "--inject_fault='prefill:explode@3': the kind is not error, throw, stall or overread"},
      {{{"inject_fault", "prefill:stall@2"}},
       "--inject_fault='prefill:stall@2': a stall needs a positive DURATION"},
      {{{"inject_fault", "kv_transfer:error@1"}},
       "--inject_fault='kv_transfer:error@1': kv_transfer takes error@N, stall@N:DURATION or "
       "overread@N on a --role=decode daemon, stall@N:DURATION on a --role=prefill one"},
      {{{"inject_fault", "prefill:overread@1"}},
       "--inject_fault='prefill:overread@1': overread is for kv_transfer"},
      {{{"inject_fault", "decode:error@1"}, {"disagg_output_threshold", "off"}},
       "--inject_fault='decode:error@1': there is no decode worker"},
      {{{"drain_timeout", "-1s"}}, "--drain_timeout=-1s: must be >= 0"},
      {{{"stall_timeout", "0s"}}, "--stall_timeout=0: must be > 0"},
      {{{"peer_load_interval", "0s"}}, "--peer_load_interval=0: must be > 0"},
      {{{"priority_aging", "-1s"}}, "--priority_aging=-1s: must be >= 0"},
      {{{"policy", "fastest"}}, "--policy='fastest': expected slo or threshold"},
      {{{"policy", "slo"}, {"disagg_output_threshold", "32"}},
       "--disagg_output_threshold=32 goes with --policy=threshold, not --policy=slo"},
      {{{"disagg_on_max_tokens", "true"}},
       "--disagg_on_max_tokens goes with --policy=threshold, not --policy=slo"},
      {{{"decode_step_interval", "20ms"}},
       "--decode_step_interval and --prefill_min_share go with --policy=threshold"},
      {{{"slo_ttft", "0s"}}, "--slo_ttft=0: must be in (0, 1h]"},
      {{{"slo_tpot", "-5ms"}}, "--slo_tpot=-5ms: must be in (0, 1h]"},
      {{{"slo_tpot", "2h"}}, "--slo_tpot=2h: must be in (0, 1h]"},
      {{{"admission", "strict"}}, "--admission='strict': expected none or slo"},
  };
  for (const BadFlags& c : cases) {
    SCOPED_TRACE(c.message);
    absl::FlagSaver saver;
    absl::StatusOr<DaemonOptions> options = OptionsWith(c.flags);
    ASSERT_FALSE(options.ok()) << c.message;
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << options.status();
    EXPECT_THAT(std::string(options.status().message()), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace tandem::server
