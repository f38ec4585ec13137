// The two lanes on one GPU with the SM partition (green contexts): a prefill
// whose work switches between the whole device and the narrowed partition
// while the decode lane starts and ends steps gives the logits of a prefill
// with no partition. Uses a random-weights SmolLM2-135M shape (no file).
// Skips, saying why, where there is no CUDA device or module; on a GPU
// whose driver has no green contexts it fails (scripts/gpu-check counts a
// skip there as a failure too), naming what the backend reported.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine/model/llama_model.h"
#include "engine/model/random_model.h"
#include "tests/gpu/gpu_test_support.h"

namespace tandem {
namespace {

TEST(CudaLanesTest, APrefillSwitchingPartitionsGivesTheLogitsOfOneWithout) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> whole =
      testing::CudaBackendOrWhyNot(kernels::LanePriority::kThroughput, /*decode_sms=*/0);
  if (!whole.ok()) GTEST_SKIP() << "no CUDA backend here: " << whole.status();
  absl::StatusOr<std::unique_ptr<kernels::Backend>> split =
      testing::CudaBackendOrWhyNot(kernels::LanePriority::kThroughput, /*decode_sms=*/-1);
  absl::StatusOr<std::unique_ptr<kernels::Backend>> decode =
      testing::CudaBackendOrWhyNot(kernels::LanePriority::kLatency, /*decode_sms=*/-1);
  ASSERT_TRUE(split.ok() && decode.ok());
  ASSERT_NE((*split)->name().find("green context"), std::string::npos)
      << "no SM partition: " << (*split)->name();

  auto file = model::OpenRandomModel("random:smollm2-135m@3");
  ASSERT_TRUE(file.ok()) << file.status();
  std::shared_ptr<const model::GgufFile> shared(*std::move(file));
  constexpr int kBlockSize = 16, kTokens = 600;
  constexpr int kBlocks = kTokens / kBlockSize + 1;
  auto reference = model::LlamaModel::Create(shared, whole->get(), kBlocks, kBlockSize);
  auto switching = model::LlamaModel::Create(shared, split->get(), kBlocks, kBlockSize);
  ASSERT_TRUE(reference.ok() && switching.ok());
  std::vector<int32_t> table(kBlocks), prompt;
  for (int b = 0; b < kBlocks; ++b) table[static_cast<size_t>(b)] = b;
  for (int i = 0; i < kTokens; ++i) prompt.push_back(30 + (i * 131) % 40000);
  // The last 64 rows' logits (every layer of every row feeds them).
  const model::SequenceInput input{prompt, 0, table, 64};

  // On the partition cuBLAS sizes its grids for fewer SMs
  // (cublasSetSmCountTarget) and may pick other kernels: float32 sums in
  // another order, bf16 activations a rounding apart. A stream-ordering bug
  // (a kernel reading a buffer not yet written) gives errors of order 1.
  constexpr double kTolerance = 1e-2;
  std::vector<float> expected, idle, busy, toggling;
  ASSERT_TRUE((*reference)->Forward({&input, 1}, &expected).ok());
  ASSERT_TRUE((*switching)->Forward({&input, 1}, &idle).ok());
  // The decode lane busy throughout: the prefill runs narrowed.
  (*decode)->BeginStep();
  ASSERT_TRUE((*switching)->Forward({&input, 1}, &busy).ok());
  (*decode)->EndStep();
  // Decode steps starting and ending meanwhile: the prefill switches.
  std::atomic<bool> done{false};
  int steps = 0;
  std::thread decoder([&] {
    while (!done.load()) {
      (*decode)->BeginStep();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      (*decode)->EndStep();
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      ++steps;
    }
  });
  for (int i = 0; i < 3; ++i) {
    // No ASSERT here: returning with the decoder thread joinable would abort.
    const bool ran = (*switching)->Forward({&input, 1}, &toggling).ok();
    EXPECT_TRUE(ran) << "run " << i;
    if (!ran) break;
    EXPECT_LE(testing::NormalisedError(toggling, expected), kTolerance) << "run " << i;
  }
  done.store(true);
  decoder.join();
  EXPECT_GT(steps, 0);
  EXPECT_LE(testing::NormalisedError(idle, expected), kTolerance);
  EXPECT_LE(testing::NormalisedError(busy, expected), kTolerance);
}

}  // namespace
}  // namespace tandem
