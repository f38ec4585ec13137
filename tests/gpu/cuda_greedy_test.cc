// The real model on the GPU against the CPU backend: five prompts decoded
// greedily for 64 tokens each, as one ragged batch on both devices. The GPU
// is teacher-forced with the CPU's tokens, so every one of the 320 positions
// is compared on the same history: at least 95% must pick the same token, and
// every position that differs must be a near-tie in the CPU's own logits
// (bf16 weights move logits by a few hundredths; a real bug moves them far
// more). Skips, saying why, where there is no CUDA device or module.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <thread>

#include "engine/kernels/cpu/cpu_backend.h"
#include "engine/model/gguf_file.h"
#include "engine/model/llama_model.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/integration/test_model.h"

namespace tandem {
namespace {

constexpr int kSteps = 64;
// Largest CPU-logit gap between the CPU's pick and the GPU's that still
// counts as a tie.
constexpr float kNearTie = 0.5f;

int32_t ArgMax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

TEST(CudaGreedyTest, RealModelPicksTheCpuBackendsTokens) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> gpu = testing::CudaBackendOrWhyNot();
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA backend here: " << gpu.status();
  absl::StatusOr<std::unique_ptr<model::GgufFile>> opened =
      model::GgufFile::Open(testing::TestModelPath());
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::shared_ptr<const model::GgufFile> file(*std::move(opened));
  absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tok =
      tokenizer::BpeTokenizer::FromGguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status();

  const char* texts[] = {
      "The capital of France is",
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
      "Here is a short story about a lighthouse keeper who finds a message in a bottle.",
      "Q: What is 17 times 23?\nA:",
      "List three reasons why the sky appears blue during the day:\n1.",
  };
  const int block_size = 16, per_sequence = 16, sequences = 5;
  kernels::cpu::CpuBackend cpu(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
                               kernels::cpu::MatMulMode::kF32);
  auto cpu_model = model::LlamaModel::Create(file, &cpu, sequences * per_sequence, block_size);
  ASSERT_TRUE(cpu_model.ok()) << cpu_model.status();
  auto gpu_model =
      model::LlamaModel::Create(file, gpu->get(), sequences * per_sequence, block_size);
  ASSERT_TRUE(gpu_model.ok()) << gpu_model.status();

  std::vector<std::vector<int32_t>> tokens, tables;
  for (int s = 0; s < sequences; ++s) {
    tokens.push_back((*tok)->Encode(texts[s], /*parse_special=*/false));
    std::vector<int32_t> table;
    for (int b = 0; b < per_sequence; ++b) table.push_back(s * per_sequence + b);
    tables.push_back(table);
  }
  std::vector<int32_t> prompt_length;
  for (const std::vector<int32_t>& t : tokens)
    prompt_length.push_back(static_cast<int32_t>(t.size()));
  const int vocab = (*cpu_model)->config().vocab;
  std::vector<model::SequenceInput> inputs;
  for (int s = 0; s < sequences; ++s) inputs.push_back({tokens[s], 0, tables[s], 1});
  std::vector<float> cpu_logits, gpu_logits;
  int agree = 0, total = 0;
  std::vector<int> first_difference(sequences, kSteps);
  for (int step = 0; step < kSteps; ++step) {
    ASSERT_TRUE((*cpu_model)->Forward(inputs, &cpu_logits).ok());
    ASSERT_TRUE((*gpu_model)->Forward(inputs, &gpu_logits).ok());
    std::vector<std::vector<int32_t>> next(sequences);
    for (int s = 0; s < sequences; ++s) {
      const std::span<const float> c(cpu_logits.data() + int64_t{s} * vocab, vocab);
      const std::span<const float> g(gpu_logits.data() + int64_t{s} * vocab, vocab);
      const int32_t cpu_pick = ArgMax(c), gpu_pick = ArgMax(g);
      ++total;
      if (cpu_pick == gpu_pick) {
        ++agree;
      } else {
        first_difference[s] = std::min(first_difference[s], step);
        EXPECT_LT(c[cpu_pick] - c[gpu_pick], kNearTie)
            << "sequence " << s << " step " << step << ": the GPU picked " << gpu_pick
            << ", the CPU " << cpu_pick << ", not a near-tie";
      }
      next[s] = {cpu_pick};  // teacher-forced: both continue from the CPU's token
    }
    for (int s = 0; s < sequences; ++s) {
      const int32_t position = prompt_length[s] + step;
      tokens[s] = next[s];
      inputs[s] = {tokens[s], position, tables[s], 1};
    }
  }
  std::cout << "greedy agreement: " << agree << " of " << total << " positions; first "
            << "differences at steps";
  for (int d : first_difference) std::cout << " " << d;
  std::cout << " (" << kSteps << ": none)\n";
  EXPECT_GE(agree * 100, total * 95) << agree << " of " << total << " positions agree";
}

}  // namespace
}  // namespace tandem
