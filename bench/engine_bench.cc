// tandem-bench: measures the engine's prefill and decode speed at batch 1.
//
//   tandem-bench --model=FILE --threads=2 [--prompt_tokens=512]
//                [--decode_tokens=128] [--repeats=3] [--cpu_matmul=auto|f32|bf16|q8]
//
// Prefill: one prompt of --prompt_tokens tokens, in one forward pass.
// Decode: --decode_tokens greedy steps after it, one token per step (the
// sampler included). Each is repeated --repeats times on a fresh KV cache;
// the median is printed, as "key value" lines for scripts to read.
// Verify: with --verify_widths, the time of one forward pass that runs W
// tokens of one sequence after the prompt with logits for all W (what
// verifying W-1 drafted tokens costs), relative to W = 1, for each width;
// and the same for --verify_batch sequences side by side. This is the cost
// curve behind the speculative-decoding policy.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "engine/kernels/cpu/cpu_backend.h"
#include "engine/model/llama_model.h"
#include "engine/model/random_model.h"
#include "engine/sampling/sampler.h"

ABSL_FLAG(std::string, model, "models/SmolLM2-135M-Instruct.Q4_1.gguf",
          "GGUF model, or random:NAME (llama3-8b, qwen2.5-7b, smollm2-135m: random weights)");
ABSL_FLAG(int, threads, 2, "CPU threads");
ABSL_FLAG(int, prompt_tokens, 512, "prompt length for prefill");
ABSL_FLAG(int, decode_tokens, 128, "tokens generated for decode");
ABSL_FLAG(int, repeats, 3, "repetitions (the median is reported)");
ABSL_FLAG(std::string, cpu_matmul, "auto", "CPU matmul mode: auto, f32, bf16 or q8");
ABSL_FLAG(std::vector<std::string>, verify_widths, {},
          "tokens per sequence in one forward pass, e.g. 1,2,4,8 (empty: skip)");
ABSL_FLAG(int, verify_batch, 1, "sequences per forward pass for --verify_widths");

namespace tandem {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times forward passes of --verify_batch sequences with W tokens each at the
// end of the prompt (whose KV the prefill above left in the cache; every
// sequence reads the same blocks and writes the same slots, which costs the
// same as distinct ones).
int MeasureVerifyWidths(model::LlamaModel& model, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& table) {
  const int batch = absl::GetFlag(FLAGS_verify_batch);
  double base = 0.0;
  std::vector<float> logits;
  for (const std::string& text : absl::GetFlag(FLAGS_verify_widths)) {
    int width = 0;
    if (!absl::SimpleAtoi(text, &width) || width < 1) {
      std::cerr << "--verify_widths: '" << text << "' is not a positive integer\n";
      return 2;
    }
    std::vector<int32_t> tokens(prompt.end() - width, prompt.end());
    std::vector<model::SequenceInput> inputs(
        static_cast<size_t>(batch),
        {tokens, static_cast<int32_t>(prompt.size()) - width, table, width});
    std::vector<double> ms;
    for (int rep = 0; rep < 4 * absl::GetFlag(FLAGS_repeats) + 1; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      if (auto s = model.Forward(inputs, &logits); !s.ok()) {
        std::cerr << s << "\n";
        return 1;
      }
      const auto t1 = std::chrono::steady_clock::now();
      if (rep > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    const double median = Median(ms);
    if (base == 0.0) base = median;
    std::cout << "verify_batch" << batch << "_width" << width << "_ms " << median << " relative "
              << median / base << "\n";
  }
  return 0;
}

int Run() {
  const std::string path = absl::GetFlag(FLAGS_model);
  auto file =
      model::IsRandomModel(path) ? model::OpenRandomModel(path) : model::GgufFile::Open(path);
  if (!file.ok()) {
    std::cerr << file.status() << "\n";
    return 1;
  }
  std::shared_ptr<const model::GgufFile> shared(std::move(*file));
  auto mode = kernels::cpu::ParseMatMulMode(absl::GetFlag(FLAGS_cpu_matmul));
  if (!mode.ok()) {
    std::cerr << mode.status() << "\n";
    return 2;
  }
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  constexpr int kBlockSize = 16;
  const int blocks = (prompt_tokens + decode_tokens) / kBlockSize + 2;
  kernels::cpu::CpuBackend backend(absl::GetFlag(FLAGS_threads), *mode);
  auto model = model::LlamaModel::Create(shared, &backend, blocks, kBlockSize);
  if (!model.ok()) {
    std::cerr << model.status() << "\n";
    return 1;
  }
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int b = 0; b < blocks; ++b) table[static_cast<size_t>(b)] = b;
  std::vector<int32_t> prompt;
  for (int i = 0; i < prompt_tokens; ++i) prompt.push_back(100 + (i * 7919) % 40000);

  std::vector<double> prefill, decode;
  std::vector<float> logits;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats) + 1; ++rep) {  // +1: warm-up
    const auto t0 = std::chrono::steady_clock::now();
    model::SequenceInput in{prompt, 0, table, 1};
    if (auto s = (*model)->Forward({&in, 1}, &logits); !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<int32_t> token(1);
    for (int i = 0; i < decode_tokens; ++i) {
      token[0] = sampling::Sample(logits, step::SamplingParams{}, 0);
      model::SequenceInput step{token, prompt_tokens + i, table, 1};
      if (auto s = (*model)->Forward({&step, 1}, &logits); !s.ok()) {
        std::cerr << s << "\n";
        return 1;
      }
    }
    const auto t2 = std::chrono::steady_clock::now();
    if (rep == 0) continue;
    prefill.push_back(prompt_tokens / std::chrono::duration<double>(t1 - t0).count());
    decode.push_back(decode_tokens / std::chrono::duration<double>(t2 - t1).count());
  }
  std::cout << "backend " << backend.name() << "\n"
            << "prompt_tokens " << prompt_tokens << "\n"
            << "decode_tokens " << decode_tokens << "\n"
            << "prefill_tokens_per_second " << Median(prefill) << "\n"
            << "decode_tokens_per_second " << Median(decode) << "\n";
  return MeasureVerifyWidths(**model, prompt, table);
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::Run();
}
