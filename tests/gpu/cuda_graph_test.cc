// Recorded decode steps (CUDA graphs) on the GPU: the same decode steps with
// recording on and off give the same logits, through the first (eager),
// second (captured) and later (replayed) steps of a batch size, across two
// batch sizes, with the batch's positions and block tables changing every
// step (what a replay must pick up from the staged inputs). Uses a
// random-weights SmolLM2-135M shape (no file). Skips, saying why, where
// there is no CUDA device or module.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "engine/model/llama_model.h"
#include "engine/model/random_model.h"
#include "tests/gpu/gpu_test_support.h"

namespace tandem {
namespace {

TEST(CudaGraphTest, RecordedDecodeStepsMatchIssuedSteps) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> eager_backend = testing::CudaBackendOrWhyNot();
  if (!eager_backend.ok()) GTEST_SKIP() << "no CUDA backend here: " << eager_backend.status();
  absl::StatusOr<std::unique_ptr<kernels::Backend>> graph_backend = testing::CudaBackendOrWhyNot();
  ASSERT_TRUE(graph_backend.ok()) << graph_backend.status();
  auto file = model::OpenRandomModel("random:smollm2-135m@7");
  ASSERT_TRUE(file.ok()) << file.status();
  std::shared_ptr<const model::GgufFile> shared(*std::move(file));
  constexpr int kBlockSize = 16, kBlocksPerSequence = 8, kSequences = 6;
  auto eager = model::LlamaModel::Create(shared, eager_backend->get(),
                                         kSequences * kBlocksPerSequence, kBlockSize);
  auto graphed = model::LlamaModel::Create(shared, graph_backend->get(),
                                           kSequences * kBlocksPerSequence, kBlockSize);
  ASSERT_TRUE(eager.ok() && graphed.ok());
  (*eager)->set_step_graphs(false);

  // Sequence s owns blocks in reverse order, so tables differ per sequence.
  std::vector<std::vector<int32_t>> tables(kSequences), tokens(kSequences);
  std::vector<int32_t> length(kSequences);
  std::vector<model::SequenceInput> inputs;
  for (int s = 0; s < kSequences; ++s) {
    for (int b = kBlocksPerSequence - 1; b >= 0; --b)
      tables[s].push_back(s * kBlocksPerSequence + b);
    for (int i = 0; i < 3 + 5 * s; ++i) tokens[s].push_back(40 + 11 * s + 7 * i);
    length[s] = static_cast<int32_t>(tokens[s].size());
    inputs.push_back({tokens[s], 0, tables[s], 1});
  }
  std::vector<float> a, b;
  ASSERT_TRUE((*eager)->Forward(inputs, &a).ok());
  ASSERT_TRUE((*graphed)->Forward(inputs, &b).ok());
  const int64_t vocab = (*eager)->config().vocab;
  // Batch 3 (padded to 4) four times, then 6 (padded to 8) four times.
  int step = 0;
  for (int batch : {3, 3, 3, 3, 6, 6, 6, 6}) {
    inputs.clear();
    for (int s = 0; s < batch; ++s) {
      const float* row = a.data() + int64_t{s} * vocab;
      tokens[s] = {static_cast<int32_t>(std::max_element(row, row + vocab) - row)};
      inputs.push_back({tokens[s], length[s]++, tables[s], 1});
    }
    ASSERT_TRUE((*eager)->Forward(inputs, &a).ok());
    ASSERT_TRUE((*graphed)->Forward(inputs, &b).ok());
    ASSERT_EQ(a.size(), b.size());
    const double error = testing::NormalisedError(b, a);
    EXPECT_LE(error, 1e-6) << "step " << step << " (batch " << batch << ")";
    for (int s = 0; s < batch; ++s) {
      const float* ra = a.data() + int64_t{s} * vocab;
      const float* rb = b.data() + int64_t{s} * vocab;
      EXPECT_EQ(std::max_element(ra, ra + vocab) - ra, std::max_element(rb, rb + vocab) - rb)
          << "step " << step << " sequence " << s;
    }
    ++step;
  }
}

}  // namespace
}  // namespace tandem
