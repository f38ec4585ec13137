// tandem-bench: measures the engine's prefill and decode speed.
//
//   tandem-bench --model=FILE|random:NAME [--device=cpu|cuda|auto] [--threads=2]
//                [--prompt_tokens=512] [--decode_tokens=128] [--decode_batch=1]
//                [--repeats=3] [--cpu_matmul=auto|f32|bf16|q8]
//
// Prefill: one prompt of --prompt_tokens tokens, in one forward pass.
// Decode: for each --decode_batch size B, B sequences of --decode_context
// prompt tokens (prefilled untimed), then --decode_tokens greedy steps of one
// token per sequence (the sampler included). Each is repeated --repeats times;
// the median is printed, as "key value" lines for scripts to read, with the
// bytes of the matrices a decode step reads (bf16 on the GPU) so that a
// script can compare the step time with the memory bandwidth.
// Verify: with --verify_widths, the time of one forward pass that runs W
// tokens of one sequence after the prompt with logits for all W (what
// verifying W-1 drafted tokens costs), relative to W = 1, for each width;
// and the same for --verify_batch sequences side by side. This is the cost
// curve behind the speculative-decoding policy.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_device.h"
#include "common/median.h"
#include "engine/kernels/backend_factory.h"
#include "engine/model/llama_model.h"
#include "engine/model/random_model.h"
#include "engine/sampling/sampler.h"

ABSL_FLAG(std::string, model, "models/SmolLM2-135M-Instruct.Q4_1.gguf",
          "GGUF model, or random:NAME (llama3-8b, llama3.2-1b, qwen2.5-3b, qwen2.5-7b, qwen3-8b, "
          "olmoe-1b-7b, smollm2-135m: random weights)");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or auto (as the daemon's --device)");
ABSL_FLAG(int, threads, 2, "CPU threads");
ABSL_FLAG(bool, cuda_graphs, true, "decode steps as CUDA graphs (--device=cuda)");
ABSL_FLAG(std::vector<std::string>, decode_batch, std::vector<std::string>({"1"}),
          "sequences decoded together; a list (1,64,256) measures each");
ABSL_FLAG(int, decode_context, 512,
          "prompt tokens of each decoded sequence (at most --prompt_tokens)");
ABSL_FLAG(int, prompt_tokens, 512, "prompt length for prefill");
ABSL_FLAG(int, decode_tokens, 128, "tokens generated for decode");
ABSL_FLAG(int, repeats, 3, "repetitions (the median is reported)");
ABSL_FLAG(std::string, cpu_matmul, "auto", "CPU matmul mode: auto, f32, bf16 or q8");
ABSL_FLAG(std::vector<std::string>, verify_widths, {},
          "tokens per sequence in one forward pass, e.g. 1,2,4,8 (empty: skip)");
ABSL_FLAG(int, verify_batch, 1, "sequences per forward pass for --verify_widths");
ABSL_FLAG(std::string, write_gguf, "",
          "write --model (a random:NAME) to this GGUF file in --type and exit, so that "
          "llama.cpp can time the very same file");
ABSL_FLAG(std::string, type, "Q4_K_M",
          "file type for --write_gguf: Q4_K_M, Q5_K_M, Q6_K, Q8_0, IQ4_XS, BF16, F16 or F32 "
          "(llama-quantize's per-tensor rules)");

namespace tandem {
namespace {

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
  auto mode = kernels::cpu::ParseMatMulMode(absl::GetFlag(FLAGS_cpu_matmul));
  if (!mode.ok()) {
    std::cerr << mode.status() << "\n";
    return 2;
  }
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  const int context = std::min(prompt_tokens, absl::GetFlag(FLAGS_decode_context));
  std::vector<int> batches;
  for (const std::string& text : absl::GetFlag(FLAGS_decode_batch)) {
    int b = 0;
    if (!absl::SimpleAtoi(text, &b) || b < 1) {
      std::cerr << "--decode_batch: '" << text << "' is not a positive integer\n";
      return 2;
    }
    batches.push_back(b);
  }
  if (batches.empty()) batches.push_back(1);
  absl::StatusOr<kernels::DeviceChoice> device = ChooseBenchDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return 2;
  auto pool = std::make_shared<kernels::cpu::ComputePool>(
      std::max(1, absl::GetFlag(FLAGS_threads)), std::vector<int>{}, /*pin_callers=*/false);
  absl::StatusOr<std::unique_ptr<kernels::Backend>> backend =
      kernels::CreateBackend({device->device, pool, kernels::LanePriority::kThroughput, *mode});
  if (!backend.ok()) {
    std::cerr << backend.status() << "\n";
    return 1;
  }
  // The model after the backend: a missing device fails before a large
  // random model is built.
  const std::string path = absl::GetFlag(FLAGS_model);
  auto file = model::OpenModel(path);
  if (!file.ok()) {
    std::cerr << file.status() << "\n";
    return 1;
  }
  std::shared_ptr<const model::GgufFile> shared(std::move(*file));
  // Blocks for the prefill prompt, or for the largest batch of decoded
  // sequences, whichever needs more; each sequence owns a range of them.
  constexpr int kBlockSize = 16;
  const int prefill_blocks = (prompt_tokens + decode_tokens) / kBlockSize + 2;
  const int decode_blocks = (context + decode_tokens) / kBlockSize + 2;
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int blocks = std::max(prefill_blocks, decode_blocks * max_batch);
  auto model = model::LlamaModel::Create(shared, backend->get(), blocks, kBlockSize);
  if (!model.ok()) {
    std::cerr << model.status() << "\n";
    return 1;
  }
  (*model)->set_step_graphs(absl::GetFlag(FLAGS_cuda_graphs));
  auto table_of = [&](int sequence, int count) {
    std::vector<int32_t> table(static_cast<size_t>(count));
    for (int b = 0; b < count; ++b) table[static_cast<size_t>(b)] = sequence * count + b;
    return table;
  };
  const std::vector<int32_t> table = table_of(0, prefill_blocks);
  std::vector<int32_t> prompt;
  for (int i = 0; i < prompt_tokens; ++i) prompt.push_back(100 + (i * 7919) % 40000);
  const int64_t vocab = (*model)->config().vocab;
  auto greedy = [&](const std::vector<float>& logits, int row) {
    return sampling::Sample(std::span<const float>(logits).subspan(static_cast<size_t>(row * vocab),
                                                                   static_cast<size_t>(vocab)),
                            step::SamplingParams{}, 0);
  };

  const model::ModelConfig& c = (*model)->config();
  const int64_t q_width = int64_t{c.heads} * c.head_dim,
                kv_width = int64_t{c.kv_heads} * c.head_dim;
  const int64_t matrix_elements =
      c.layers * (2 * q_width * c.embedding + 2 * kv_width * c.embedding +
                  3 * int64_t{c.ffn} * c.embedding) +
      int64_t{c.vocab} * c.embedding;
  std::cout << "backend " << (*backend)->name() << "\n"
            << "prompt_tokens " << prompt_tokens << "\n"
            << "decode_tokens " << decode_tokens << "\n"
            << "decode_context " << context << "\n"
            << "decode_matrix_bf16_bytes " << matrix_elements * 2 << "\n"
            << "prefill_flops_per_token " << 2 * (matrix_elements - int64_t{c.vocab} * c.embedding)
            << "\n"
            // Scores and weighted values over the causal triangle.
            << "prefill_attention_flops "
            << 4.0 * q_width * c.layers *
                   (static_cast<double>(prompt_tokens) * (prompt_tokens + 1) / 2)
            << "\n";

  std::vector<double> prefill;
  std::vector<float> logits;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats) + 1; ++rep) {  // +1: warm-up
    const auto t0 = std::chrono::steady_clock::now();
    model::SequenceInput in{prompt, 0, table, 1};
    if (auto s = (*model)->Forward({&in, 1}, &logits); !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (rep > 0) prefill.push_back(prompt_tokens / std::chrono::duration<double>(t1 - t0).count());
  }
  std::cout << "prefill_tokens_per_second " << Median(prefill) << std::endl;

  for (size_t bi = 0; bi < batches.size(); ++bi) {
    const int batch = batches[bi];
    std::vector<std::vector<int32_t>> tables, tokens(static_cast<size_t>(batch));
    std::vector<model::SequenceInput> inputs;
    const std::vector<int32_t> context_prompt(prompt.begin(), prompt.begin() + context);
    for (int s = 0; s < batch; ++s) tables.push_back(table_of(s, decode_blocks));
    for (int s = 0; s < batch; ++s)
      inputs.push_back({context_prompt, 0, tables[static_cast<size_t>(s)], 1});
    if (auto s = (*model)->Forward(inputs, &logits); !s.ok()) {  // the prompts, untimed
      std::cerr << s << "\n";
      return 1;
    }
    std::vector<double> decode;
    std::vector<int32_t> picked;
    for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats) + 1; ++rep) {  // +1: warm-up
      for (int s = 0; s < batch; ++s) tokens[static_cast<size_t>(s)] = {greedy(logits, s)};
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < decode_tokens; ++i) {
        inputs.clear();
        for (int s = 0; s < batch; ++s) {
          inputs.push_back(
              {tokens[static_cast<size_t>(s)], context + i, tables[static_cast<size_t>(s)], 1});
        }
        // As the daemon runs a greedy step: token ids, not logits, come back.
        if (auto s = (*model)->ForwardGreedy(inputs, &picked); !s.ok()) {
          std::cerr << s << "\n";
          return 1;
        }
        for (int s = 0; s < batch; ++s)
          tokens[static_cast<size_t>(s)] = {picked[static_cast<size_t>(s)]};
      }
      const auto t1 = std::chrono::steady_clock::now();
      if (rep > 0) {
        decode.push_back(static_cast<double>(decode_tokens) * batch /
                         std::chrono::duration<double>(t1 - t0).count());
      }
    }
    const double tps = Median(decode);
    if (bi == 0) std::cout << "decode_tokens_per_second " << tps << "\n";
    std::cout << "decode_batch" << batch << "_tokens_per_second " << tps << "\n"
              << "decode_batch" << batch << "_step_ms " << 1000.0 * batch / tps << std::endl;
  }
  return MeasureVerifyWidths(**model, prompt, table);
}

// --write_gguf: the random model, written in --type; its size and the time
// taken on stdout.
int WriteGguf(const std::string& path) {
  absl::StatusOr<model::FileType> type = model::ParseFileType(absl::GetFlag(FLAGS_type));
  if (!type.ok()) {
    std::fprintf(stderr, "%s\n", type.status().ToString().c_str());
    return 2;
  }
  const std::string model_flag = absl::GetFlag(FLAGS_model);
  const absl::Time start = absl::Now();
  if (absl::Status s =
          model::WriteRandomModel(model_flag, *type, path, absl::GetFlag(FLAGS_threads));
      !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<model::GgufFile>> file = model::GgufFile::Open(path);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return 1;
  }
  std::printf("%s: %s as %s, %zu MiB, written in %.1f s\n", path.c_str(), model_flag.c_str(),
              std::string(model::FileTypeName(*type)).c_str(), (*file)->file_bytes() >> 20,
              absl::ToDoubleSeconds(absl::Now() - start));
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (const std::string path = absl::GetFlag(FLAGS_write_gguf); !path.empty()) {
    return tandem::WriteGguf(path);
  }
  return tandem::Run();
}
