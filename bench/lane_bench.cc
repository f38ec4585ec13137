// tandem-lane-bench: the two lanes on one device's shared compute, measured.
//
//   tandem-lane-bench --model=FILE|random:NAME [--device=cpu|cuda|auto]
//                     [--threads=0] [--cuda_decode_sms=-1] [--prompt_tokens=2000]
//                     [--chunk=128] [--interval_ms=25] [--decode_batch=1]
//                     [--repeats=3]
//
// On the CPU both lanes share one compute pool (--threads); on a GPU each
// lane has its stream, and --cuda_decode_sms the SMs a prefill leaves free
// while decode runs (0: stream priorities only).
//
// A prefill thread runs a --prompt_tokens prompt in --chunk-token steps on
// the throughput lane, --repeats times; meanwhile a decode thread runs a
// decode step of --decode_batch sequences (at a 256-token context) every
// --interval_ms on the latency lane, as the paced decode worker does. It
// prints, as "key value" lines: the decode steps' start delay (the wait for
// the prefill step's running tasks; p50, p99, max in microseconds; zero on
// a GPU, where a step does not wait to start), the
// decode step time alone and under the prefill (median ms), and the prefill
// speed alone and while yielding (tokens/s).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_device.h"
#include "engine/kernels/backend_factory.h"
#include "engine/model/llama_model.h"
#include "engine/model/random_model.h"

ABSL_FLAG(std::string, model, "models/SmolLM2-135M-Instruct.Q4_1.gguf",
          "GGUF model, or random:NAME (llama3-8b, llama3.2-1b, qwen2.5-3b, qwen2.5-7b, qwen3-8b, "
          "olmoe-1b-7b, smollm2-135m: random weights)");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or auto (as the daemon's --device)");
ABSL_FLAG(int, threads, 0, "CPU compute threads (0: one per CPU)");
ABSL_FLAG(int, cuda_decode_sms, -1,
          "--device=cuda: SMs a prefill leaves free while decode runs (-1 auto, 0 none)");
ABSL_FLAG(int, prompt_tokens, 2000, "prompt length");
ABSL_FLAG(int, chunk, 128, "prompt tokens per prefill step");
ABSL_FLAG(int, interval_ms, 25, "a decode step every this many ms while the prompt runs");
ABSL_FLAG(int, decode_batch, 1, "sequences per decode step");
ABSL_FLAG(int, repeats, 3, "prompts run");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

int Run() {
  absl::StatusOr<kernels::DeviceChoice> device = ChooseBenchDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return 2;
  const std::string path = absl::GetFlag(FLAGS_model);
  auto file = model::OpenModel(path);
  if (!file.ok()) {
    std::cerr << file.status() << "\n";
    return 1;
  }
  std::shared_ptr<const model::GgufFile> shared(std::move(*file));
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = std::max(1, static_cast<int>(kernels::cpu::AllowedCpus().size()));
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int chunk = absl::GetFlag(FLAGS_chunk);
  const int batch = absl::GetFlag(FLAGS_decode_batch);
  constexpr int kBlockSize = 16;
  constexpr int kContext = 256;
  const int prompt_blocks = prompt_tokens / kBlockSize + 1;
  const int decode_blocks = kContext / kBlockSize + 1;
  const int blocks = prompt_blocks + batch * decode_blocks;

  std::shared_ptr<kernels::cpu::ComputePool> pool;
  if (device->device == kernels::Device::kCpu) {
    pool = std::make_shared<kernels::cpu::ComputePool>(threads, kernels::cpu::AllowedCpus());
  }
  auto make_backend = [&](kernels::LanePriority lane) {
    kernels::BackendSpec spec;
    spec.device = device->device;
    spec.pool = pool;
    spec.lane = lane;
    spec.cuda_decode_sms = absl::GetFlag(FLAGS_cuda_decode_sms);
    return kernels::CreateBackend(spec);
  };
  absl::StatusOr<std::unique_ptr<kernels::Backend>> made_prefill =
      make_backend(kernels::LanePriority::kThroughput);
  absl::StatusOr<std::unique_ptr<kernels::Backend>> made_decode =
      make_backend(kernels::LanePriority::kLatency);
  for (const auto* made : {&made_prefill, &made_decode}) {
    if (!made->ok()) {
      std::cerr << made->status() << "\n";
      return 1;
    }
  }
  kernels::Backend& prefill_backend = **made_prefill;
  kernels::Backend& decode_backend = **made_decode;
  std::cerr << "prefill: " << prefill_backend.name() << "\ndecode: " << decode_backend.name()
            << std::endl;
  auto prefill = model::LlamaModel::Create(shared, &prefill_backend, blocks, kBlockSize);
  if (!prefill.ok()) {
    std::cerr << prefill.status() << "\n";
    return 1;
  }
  auto decode = model::LlamaModel::CreateSharingKv(**prefill, &decode_backend);
  if (!decode.ok()) {
    std::cerr << decode.status() << "\n";
    return 1;
  }

  std::vector<int32_t> prompt_table(static_cast<size_t>(prompt_blocks));
  for (int b = 0; b < prompt_blocks; ++b) prompt_table[static_cast<size_t>(b)] = b;
  std::vector<int32_t> prompt;
  for (int i = 0; i < prompt_tokens; ++i) prompt.push_back(100 + (i * 7919) % 40000);
  std::vector<std::vector<int32_t>> decode_tables(static_cast<size_t>(batch));
  for (int s = 0; s < batch; ++s) {
    for (int b = 0; b < decode_blocks; ++b) {
      decode_tables[static_cast<size_t>(s)].push_back(prompt_blocks + s * decode_blocks + b);
    }
  }
  const std::vector<int32_t> one = {42};
  std::vector<model::SequenceInput> decode_inputs;
  for (int s = 0; s < batch; ++s) {
    decode_inputs.push_back({one, kContext, decode_tables[static_cast<size_t>(s)], 1});
  }

  // One prompt in chunks, each a throughput-lane step; returns its seconds.
  auto run_prompt = [&]() {
    std::vector<float> logits;
    const auto t0 = Clock::now();
    for (int pos = 0; pos < prompt_tokens; pos += chunk) {
      const int n = std::min(chunk, prompt_tokens - pos);
      model::SequenceInput in{std::span<const int32_t>(prompt.data() + pos, n), pos, prompt_table,
                              pos + n == prompt_tokens ? 1 : 0};
      prefill_backend.BeginStep();
      if (auto s = (*prefill)->Forward({&in, 1}, &logits); !s.ok()) std::cerr << s << "\n";
      prefill_backend.EndStep();
    }
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // One decode step on the latency lane: (start delay, step ms).
  auto decode_step = [&]() {
    std::vector<float> logits;
    const auto t0 = Clock::now();
    const absl::Duration delay = decode_backend.BeginStep();
    if (auto s = (*decode)->Forward(decode_inputs, &logits); !s.ok()) std::cerr << s << "\n";
    decode_backend.EndStep();
    return std::make_pair(absl::ToDoubleMicroseconds(delay), Ms(Clock::now() - t0));
  };

  // Alone: the decode step and the prompt, each with the pool to itself.
  std::vector<double> alone_step;
  for (int i = 0; i < 21; ++i) alone_step.push_back(decode_step().second);
  run_prompt();  // warm-up
  std::vector<double> alone_prefill;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) alone_prefill.push_back(run_prompt());

  // Together.
  std::atomic<bool> done{false};
  std::vector<double> delays_us, steps_ms;
  std::thread decoder([&] {
    auto next = Clock::now();
    while (!done.load()) {
      const auto [delay, ms] = decode_step();
      delays_us.push_back(delay);
      steps_ms.push_back(ms);
      next += std::chrono::milliseconds(absl::GetFlag(FLAGS_interval_ms));
      std::this_thread::sleep_until(next);
    }
  });
  std::vector<double> shared_prefill;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) shared_prefill.push_back(run_prompt());
  done.store(true);
  decoder.join();

  std::cout << "device " << kernels::DeviceName(device->device) << "\n"
            << "threads " << threads << "\n"
            << "decode_steps " << delays_us.size() << "\n"
            << "start_delay_p50_us " << Percentile(delays_us, 0.5) << "\n"
            << "start_delay_p99_us " << Percentile(delays_us, 0.99) << "\n"
            << "start_delay_max_us " << Percentile(delays_us, 1.0) << "\n"
            << "decode_step_alone_ms " << Percentile(alone_step, 0.5) << "\n"
            << "decode_step_shared_ms " << Percentile(steps_ms, 0.5) << "\n"
            << "decode_step_shared_p99_ms " << Percentile(steps_ms, 0.99) << "\n"
            << "prefill_alone_tokens_per_second " << prompt_tokens / Percentile(alone_prefill, 0.5)
            << "\n"
            << "prefill_shared_tokens_per_second "
            << prompt_tokens / Percentile(shared_prefill, 0.5) << "\n";
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::Run();
}
