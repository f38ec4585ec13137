// The KV cache sized from free memory (--kv_cache_memory_fraction) is only
// as good as the count of what else that memory holds: LlamaModel::
// WeightBytes must equal what Create() actually uploads (here counted by a
// backend that charges the CUDA backend's bytes per upload, and shares a
// copy per host tensor as the CUDA backend does), and the plan must add a
// separate draft model's weights and pages.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <tuple>

#include "engine/kernels/cpu/cpu_backend.h"
#include "engine/model/llama_model.h"
#include "engine/model/random_model.h"
#include "server/kv_memory_plan.h"
#include "tests/integration/test_model.h"

namespace tandem {
namespace {

using kernels::DType;
using kernels::Matrix;
using kernels::Weight;

// Uploads and KV storage through a CPU backend; charges each distinct
// upload (host address, type, shape) the CUDA backend's device bytes.
// Computes nothing: these tests only load models.
class UploadCountingBackend final : public kernels::Backend {
 public:
  // What the process has on the device: shared by every backend made with
  // the same ledger, as the CUDA backend's weight cache is by both lanes'.
  struct Ledger {
    std::set<std::tuple<const void*, DType, int64_t, int64_t>> uploads;
    int64_t bytes = 0;
  };
  explicit UploadCountingBackend(std::shared_ptr<Ledger> ledger = std::make_shared<Ledger>())
      : ledger_(std::move(ledger)) {}

  int64_t uploaded_bytes() const { return ledger_->bytes; }

  std::string name() const override { return "upload counter"; }
  std::string arithmetic() const override { return "upload counter"; }
  int64_t WeightBytes(DType dtype, int64_t rows, int64_t cols) const override {
    const int64_t elements = rows * cols;  // bf16 copies; float32 stays, matrices also get bf16
    if (dtype != DType::kF32) return elements * 2;
    return elements * 4 + (rows > 1 ? elements * 2 : 0);
  }
  absl::StatusOr<Weight> UploadWeight(DType dtype, int64_t rows, int64_t cols,
                                      const void* host_data) override {
    if (ledger_->uploads.emplace(host_data, dtype, rows, cols).second) {
      ledger_->bytes += WeightBytes(dtype, rows, cols);
    }
    return cpu_.UploadWeight(dtype, rows, cols, host_data);
  }
  absl::StatusOr<std::unique_ptr<kernels::DeviceBuffer>> Allocate(size_t bytes) override {
    return cpu_.Allocate(bytes);
  }
  absl::Status CreateKvCache(const kernels::KvCacheShape& shape) override {
    return cpu_.CreateKvCache(shape);
  }
  absl::Status ShareKvCache(const Backend& other) override {
    const auto* counting = dynamic_cast<const UploadCountingBackend*>(&other);
    if (counting == nullptr) return absl::InvalidArgumentError("not an upload counter");
    return cpu_.ShareKvCache(counting->cpu_);
  }
  const kernels::KvCacheShape& kv_cache_shape() const override { return cpu_.kv_cache_shape(); }
  kernels::KvStorage kv_storage() const override { return cpu_.kv_storage(); }
  void CopyToHost(const Matrix&, float*) override { Unused(); }
  void CopyFromHost(const float*, Matrix) override { Unused(); }
  void Embed(const Weight&, std::span<const int32_t>, Matrix) override { Unused(); }
  void MatMul(const Matrix&, std::span<const Weight* const>, std::span<const Weight* const>,
              std::span<const Matrix>) override {
    Unused();
  }
  void RmsNorm(const Matrix&, const Weight&, float, Matrix) override { Unused(); }
  void Rope(Matrix, int, int, std::span<const int32_t>, const kernels::RopeSpec&) override {
    Unused();
  }
  void CopyKvBlocks(std::span<const std::pair<int32_t, int32_t>>) override { Unused(); }
  void WriteKv(int, const Matrix&, const Matrix&, std::span<const int32_t>) override { Unused(); }
  void Attention(int, const Matrix&, const kernels::AttentionShape&,
                 std::span<const kernels::AttentionSpan>, Matrix) override {
    Unused();
  }
  void SiluMul(const Matrix&, const Matrix&, Matrix) override { Unused(); }
  void GeluMul(const Matrix&, const Matrix&, Matrix) override { Unused(); }
  void Scale(Matrix, float) override { Unused(); }
  void Softcap(Matrix, float) override { Unused(); }
  void Add(Matrix, const Matrix&) override { Unused(); }
  void GatherRows(const Matrix&, std::span<const int32_t>, Matrix) override { Unused(); }
  void ScatterAddRows(Matrix, std::span<const int32_t>, std::span<const float>,
                      const Matrix&) override {
    Unused();
  }

 private:
  static void Unused() { ADD_FAILURE() << "a load-only test backend computed"; }

  kernels::cpu::CpuBackend cpu_{1};
  std::shared_ptr<Ledger> ledger_;
};

std::shared_ptr<const model::GgufFile> OpenModel(const std::string& flag) {
  absl::StatusOr<std::unique_ptr<model::GgufFile>> file = model::OpenModel(flag);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::shared_ptr<const model::GgufFile>(*std::move(file)) : nullptr;
}

TEST(WeightBytesTest, AreTheBytesOfEveryUploadCreateMakesCountedOnce) {
  // The real file (tied embeddings, a rope_freqs-free Llama) and the random
  // 135M shape; each uploads its matrices, vectors and the rotary table.
  for (const std::string& flag : {testing::TestModelPath(), std::string("random:smollm2-135m")}) {
    SCOPED_TRACE(flag);
    std::shared_ptr<const model::GgufFile> file = OpenModel(flag);
    ASSERT_NE(file, nullptr);
    UploadCountingBackend backend;
    absl::StatusOr<int64_t> planned = model::LlamaModel::WeightBytes(*file, backend);
    ASSERT_TRUE(planned.ok()) << planned.status();
    absl::StatusOr<std::unique_ptr<model::LlamaModel>> loaded =
        model::LlamaModel::Create(file, &backend, 4, 16);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(*planned, backend.uploaded_bytes());
    // SmolLM2-135M: about 135M parameters at 2 bytes, and a float32 rotary
    // table of 8,192 positions x 64 dimensions (2 MiB) among them.
    EXPECT_GT(*planned, 260'000'000);
    EXPECT_LT(*planned, 290'000'000);
  }
}

// The daemon's other lanes bind the same weights again (a decode worker
// sharing the KV cache, or with pages of its own): on the device they add
// nothing, the rotary table included.
TEST(WeightBytesTest, ASecondLaneOfTheSameModelUploadsNothingNew) {
  std::shared_ptr<const model::GgufFile> file = OpenModel("random:smollm2-135m");
  ASSERT_NE(file, nullptr);
  auto ledger = std::make_shared<UploadCountingBackend::Ledger>();
  UploadCountingBackend prefill(ledger), decode(ledger), own_pages(ledger);
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> first =
      model::LlamaModel::Create(file, &prefill, 4, 16);
  ASSERT_TRUE(first.ok()) << first.status();
  const int64_t one = ledger->bytes;
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> sharing =
      model::LlamaModel::CreateSharingKv(**first, &decode);
  ASSERT_TRUE(sharing.ok()) << sharing.status();
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> like =
      model::LlamaModel::CreateLike(**first, &own_pages, 3);
  ASSERT_TRUE(like.ok()) << like.status();
  EXPECT_EQ(ledger->bytes, one);
  EXPECT_EQ((*like)->kv_blocks(), 3);
  EXPECT_EQ((*like)->block_size(), 16);
  EXPECT_EQ(own_pages.kv_cache_shape().blocks, 3) << "pages of its own";
  // A model loaded afresh from the file builds its own rotary table: the
  // ledger sees it, so the test can tell a shared table from a rebuilt one.
  UploadCountingBackend fresh(ledger);
  ASSERT_TRUE(model::LlamaModel::Create(file, &fresh, 4, 16).ok());
  EXPECT_EQ(ledger->bytes, one + fresh.WeightBytes(DType::kF32, 1, 8192 * 64));
}

TEST(KvMemoryPlanTest, ADraftModelsWeightsAndPagesComeOutOfTheSameMemory) {
  std::shared_ptr<const model::GgufFile> file = OpenModel("random:smollm2-135m");
  ASSERT_NE(file, nullptr);
  UploadCountingBackend backend;
  absl::StatusOr<int64_t> weights = model::LlamaModel::WeightBytes(*file, backend);
  ASSERT_TRUE(weights.ok());
  kernels::KvCacheShape shape;
  shape.layers = 30;
  shape.block_size = 16;
  shape.kv_heads = 3;
  shape.head_dim = 64;
  const auto block = static_cast<int64_t>(shape.BytesPerBlock());
  ASSERT_EQ(block, 368'640) << "2 (K, V) x 30 layers x 16 tokens x 3 heads x 64 x 2 bytes";

  absl::StatusOr<server::KvMemoryPlan> alone =
      server::PlanKvMemory(*file, shape, nullptr, backend, 0);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->fixed_bytes, *weights);
  EXPECT_EQ(alone->bytes_per_block, block);
  // Half of what the weights leave: 1,000 blocks and a few bytes, halved.
  EXPECT_EQ(server::KvBlocksFromFreeMemory(0.5, *weights + 1000 * block + 7, *alone), 500);
  EXPECT_EQ(server::KvBlocksFromFreeMemory(0.5, *weights / 2, *alone), 0)
      << "less than the weights";

  // The decode lane's own pages are taken first.
  absl::StatusOr<server::KvMemoryPlan> own_decode =
      server::PlanKvMemory(*file, shape, nullptr, backend, 200 * block);
  ASSERT_TRUE(own_decode.ok());
  EXPECT_EQ(server::KvBlocksFromFreeMemory(0.5, *weights + 1000 * block, *own_decode), 400);

  // So is the suffix cache's budget, host memory like this backend's.
  absl::StatusOr<server::KvMemoryPlan> suffix_cache =
      server::PlanKvMemory(*file, shape, nullptr, backend, 0, 100 * block);
  ASSERT_TRUE(suffix_cache.ok());
  EXPECT_EQ(suffix_cache->fixed_bytes, *weights + 100 * block);
  EXPECT_EQ(server::KvBlocksFromFreeMemory(0.5, *weights + 1000 * block, *suffix_cache), 450);

  // The same file as a draft: twice the weights, and each block id has two
  // blocks of pages.
  absl::StatusOr<server::KvMemoryPlan> drafted =
      server::PlanKvMemory(*file, shape, file.get(), backend, 0);
  ASSERT_TRUE(drafted.ok()) << drafted.status();
  EXPECT_EQ(drafted->fixed_bytes, 2 * *weights);
  EXPECT_EQ(drafted->bytes_per_block, 2 * block);
  EXPECT_EQ(server::KvBlocksFromFreeMemory(0.5, 2 * *weights + 1000 * block, *drafted), 250);
}

}  // namespace
}  // namespace tandem
