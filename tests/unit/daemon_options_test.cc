// DaemonOptionsFromFlags: every flag value tandemd refuses is refused here,
// before anything starts, with INVALID_ARGUMENT naming the flag; accepted
// values become the options the daemon is assembled from. Flags are set as
// the command line would set them (by name, from text), with a FlagSaver per
// test restoring the defaults.
#include "server/daemon_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"

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

TEST(DaemonOptionsTest, TheDefaultsAreAUnifiedDaemonWithADecodeWorkerAtThirtyTwoTokens) {
  absl::FlagSaver saver;
  absl::StatusOr<DaemonOptions> options = OptionsWith({});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->role, Role::kUnified);
  EXPECT_EQ(options->device.device, kernels::Device::kCpu);  // auto, without a CUDA module
  EXPECT_EQ(options->output_threshold, 32);
  EXPECT_FALSE(options->auto_threshold);
  EXPECT_TRUE(options->model.decode_worker);
  EXPECT_EQ(options->model.block_size, 16);
  EXPECT_EQ(options->model.kv_cache_bytes, int64_t{512} << 20);
  EXPECT_EQ(options->scheduler.max_batched_tokens, 128);
  EXPECT_EQ(options->scheduler.max_running, 64);
  EXPECT_FALSE(options->scheduler.remote_decode);
  EXPECT_EQ(options->scheduler.speculation.proposer, step::Proposer::kNgram);
  EXPECT_EQ(options->speculative, "ngram");
  EXPECT_EQ(options->pacing.interval, absl::Milliseconds(40));
  EXPECT_EQ(options->pacing.prefill_min_share, 0.5);
  EXPECT_EQ(options->max_queued_requests, 256);
  EXPECT_EQ(options->requests.defaults.max_tokens, 2048);
  EXPECT_EQ(options->requests.default_deadline, absl::Minutes(10));
  EXPECT_EQ(options->listen.grpc.listen, "127.0.0.1:50051");
  EXPECT_EQ(options->listen.metrics, "127.0.0.1:9400");
  EXPECT_EQ(options->listen.grpc.api_keys, nullptr);
  EXPECT_FALSE(options->fault.has_value());
  EXPECT_EQ(options->drain_timeout, absl::Seconds(30));
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
    absl::StatusOr<DaemonOptions> decode = OptionsWith({{"role", "decode"}});
    ASSERT_TRUE(decode.ok()) << decode.status();
    EXPECT_FALSE(decode->model.decode_worker);  // one worker takes all the compute
    EXPECT_FALSE(decode->scheduler.remote_decode);
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
  EXPECT_EQ(options->pacing.interval, absl::ZeroDuration());
  EXPECT_EQ(options->pacing.prefill_min_share, 0.0);
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
      {{{"kv_cache_memory_fraction", "-0.25"}}, "--kv_cache_memory_fraction=-0.25: must be in"},
      {{{"decode_kv_cache_bytes", "-1"}}, "--decode_kv_cache_bytes=-1: needs a decode worker"},
      {{{"decode_kv_cache_bytes", "67108864"}, {"disagg_output_threshold", "off"}},
       "--decode_kv_cache_bytes=67108864: needs a decode worker"},
      {{{"decode_kv_cache_bytes", "67108864"}, {"role", "decode"}},
       "--decode_kv_cache_bytes=67108864: needs a decode worker"},
      {{{"block_size", "0"}}, "--block_size=0: must be at least 1"},
      {{{"context_length", "-5"}}, "--context_length=-5: must be >= 0"},
      {{{"speculative", "bogus"}}, "--speculative='bogus': expected off, ngram or draft"},
      {{{"speculative", "draft"}},
       "--speculative=draft needs a draft model: set --draft_model or --draft_layers"},
      {{{"spec_max_draft", "-1"}}, "--spec_max_draft must be >= 0"},
      {{{"max_batched_tokens", "0"}}, "--max_batched_tokens=0: must be at least 1"},
      {{{"max_running", "0"}}, "--max_running=0: must be at least 1"},
      {{{"max_queued_requests", "0"}}, "--max_queued_requests=0: must be at least 1"},
      {{{"kv_lease", "0s"}}, "--kv_lease must be > 0"},
      {{{"max_queued_tokens", "-1"}}, "--max_queued_tokens must be >= 0"},
      {{{"decode_step_interval", "-1ms"}}, "--decode_step_interval=-1ms: must be >= 0"},
      {{{"prefill_min_share", "1"}}, "--prefill_min_share=1: must be in [0, 1)"},
      {{{"default_temperature", "-1"}}, "--default_temperature=-1: must be a finite number >= 0"},
      {{{"default_top_p", "0"}}, "--default_top_p=0: must be in (0, 1]"},
      {{{"default_top_k", "-2"}}, "--default_top_k=-2: must be >= 0"},
      {{{"max_tokens_default", "0"}}, "--max_tokens_default=0: must be >= 1"},
      {{{"max_prompt_tokens", "-1"}}, "--max_prompt_tokens must be >= 0"},
      {{{"default_deadline", "-1s"}}, "--default_deadline must be >= 0 (got -1s)"},
      {{{"slow_reader_timeout", "-2s"}}, "--slow_reader_timeout must be >= 0 (got -2s)"},
      {{{"max_concurrent_streams", "0"}}, "--max_concurrent_streams must be at least 1"},
      {{{"max_message_bytes", "0"}}, "--max_message_bytes=0: must be at least 1"},
      {{{"api_keys_file", "/nonexistent/keys"}},
       "--api_keys_file: cannot read '/nonexistent/keys'"},
      {{{"api_keys_file", empty_keys}}, "--api_keys_file: '" + empty_keys + "' holds no keys"},
      {{{"inject_fault", "prefill:explode@3"}},
       "--inject_fault='prefill:explode@3': the kind is not error, throw or stall"},
      {{{"inject_fault", "prefill:stall@2"}},
       "--inject_fault='prefill:stall@2': a stall needs a positive DURATION"},
      {{{"inject_fault", "kv_transfer:error@1"}},
       "--inject_fault='kv_transfer:error@1': kv_transfer takes error@N, on a --role=decode"},
      {{{"inject_fault", "decode:error@1"}, {"disagg_output_threshold", "off"}},
       "--inject_fault='decode:error@1': there is no decode worker"},
      {{{"drain_timeout", "-1s"}}, "--drain_timeout=-1s: must be >= 0"},
      {{{"stall_timeout", "0s"}}, "--stall_timeout=0: must be > 0"},
      {{{"peer_load_interval", "0s"}}, "--peer_load_interval=0: must be > 0"},
      {{{"priority_aging", "-1s"}}, "--priority_aging=-1s: must be >= 0"},
  };
  for (const BadFlags& c : cases) {
    absl::FlagSaver saver;
    absl::StatusOr<DaemonOptions> options = OptionsWith(c.flags);
    ASSERT_FALSE(options.ok()) << c.message;
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << options.status();
    EXPECT_THAT(std::string(options.status().message()), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace tandem::server
