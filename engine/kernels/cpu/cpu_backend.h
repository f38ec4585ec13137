// The CPU backend: our own batch-invariant kernels (see backend.h), run on
// one lane of a compute pool (cpu/compute_pool.h), shared with another
// backend (the other worker's) or its own.
#ifndef TANDEM_ENGINE_KERNELS_CPU_CPU_BACKEND_H_
#define TANDEM_ENGINE_KERNELS_CPU_CPU_BACKEND_H_

#include <memory>
#include <vector>

#include "engine/kernels/backend.h"
#include "engine/kernels/cpu/compute_pool.h"
#include "engine/kernels/cpu/matmul.h"
#include "engine/kernels/cpu/packed_matmul.h"

namespace tandem::kernels::cpu {

class CpuBackend final : public Backend {
 public:
  // Computes on `priority`'s lane of `pool` (shared with whoever else holds
  // the pool).
  CpuBackend(std::shared_ptr<ComputePool> pool, LanePriority priority,
             MatMulMode matmul_mode = MatMulMode::kF32);
  // Computes on a pool of its own of `threads` threads (the throughput lane).
  explicit CpuBackend(int threads, MatMulMode matmul_mode = MatMulMode::kF32);

  std::string name() const override;
  std::string arithmetic() const override;
  void BindCallingThread() override { lane_.PinCallingThread(); }
  absl::Duration BeginStep() override { return lane_.BeginStep(); }
  absl::Duration EndStep() override { return lane_.EndStep(); }

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override;
  // MemAvailable (/proc/meminfo). Weights count nothing against it: they are
  // read from the mapped model file (packed copies are not counted either,
  // as when the fraction was read before loading).
  absl::StatusOr<int64_t> FreeMemoryBytes() const override;
  // What UploadWeight allocates beside the file: the packed panels and the
  // Q8_0 blocks a weight is widened to (the file's own bytes stay mapped,
  // and the kernel can drop their pages once packing has read them).
  int64_t WeightBytes(DType dtype, int64_t rows, int64_t cols) const override;
  absl::StatusOr<Weight> UploadWeight(DType dtype, int64_t rows, int64_t cols,
                                      const void* host_data) override;
  absl::Status CreateKvCache(const KvCacheShape& shape) override;
  absl::Status ShareKvCache(const Backend& other) override;
  void ReleaseKvPages() override;
  void ReleaseKvBlockPages(std::span<const int32_t> blocks, std::span<const int> layers) override;
  const KvCacheShape& kv_cache_shape() const override { return kv_shape_; }
  KvStorage kv_storage() const override {
    if (kv_storage_ == nullptr) return {};
    return {kv_storage_->data(), kv_storage_->bytes(), /*device=*/false};
  }
  void CopyToHost(const Matrix& src, float* dst) override;
  // Matrices are host memory and every operation has finished: no copy.
  const float* HostRows(const Matrix& x, std::vector<float>&) override { return x.data; }
  void CopyFromHost(const float* src, Matrix dst) override;

  void Embed(const Weight& table, std::span<const int32_t> ids, Matrix out) override;
  void MatMul(const Matrix& x, std::span<const Weight* const> weights,
              std::span<const Weight* const> biases, std::span<const Matrix> outs) override;
  void RmsNorm(const Matrix& x, const Weight& weight, float eps, Matrix out) override;
  void Rope(Matrix x, int heads, int head_dim, std::span<const int32_t> positions,
            const RopeSpec& rope) override;
  void CopyKvBlocks(std::span<const std::pair<int32_t, int32_t>> copies) override;
  void WriteKv(int layer, const Matrix& k, const Matrix& v,
               std::span<const int32_t> slots) override;
  void Attention(int layer, const Matrix& q, const AttentionShape& shape,
                 std::span<const AttentionSpan> spans, Matrix out) override;
  void SiluMul(const Matrix& gate, const Matrix& up, Matrix out) override;
  void GeluMul(const Matrix& gate, const Matrix& up, Matrix out) override;
  void Scale(Matrix x, float factor) override;
  void Softcap(Matrix x, float cap) override;
  void Add(Matrix acc, const Matrix& x) override;
  void GatherRows(const Matrix& x, std::span<const int32_t> rows, Matrix out) override;
  void ScatterAddRows(Matrix acc, std::span<const int32_t> rows, std::span<const float> weights,
                      const Matrix& x) override;

 private:
  // What UploadWeight makes of a weight.
  struct UploadPlan {
    bool widen = false;         // rewritten as Q8_0 blocks of exactly its values
    DType dtype = DType::kF32;  // the type the kernels read (Q8_0 if widened)
    bool pack = false;          // packed panels (packed_matmul.h)
    bool int8 = false;          // ... in the integer order (packed_matmul_int8.h)
  };
  UploadPlan PlanUpload(DType dtype, int64_t rows, int64_t cols) const;

  std::shared_ptr<ComputePool> pool_;
  ComputeLane& lane_;
  MatMulMode matmul_mode_;
  MatMulScratch matmul_scratch_;
  std::vector<std::vector<float>> attention_scratch_;
  KvCacheShape kv_shape_;
  std::shared_ptr<DeviceBuffer> kv_storage_;  // shared by the backends of one daemon
  // K and V in bfloat16 (the bf16 mode, attention_bf16.h), else halves.
  bool kv_bf16_ = false;
  // Packed copies of the uploaded weights (packed_matmul.h), shared with every
  // other CPU backend of the process that uploaded the same weight.
  std::vector<std::shared_ptr<const PackedWeight>> packed_weights_;
  // Q5_0 and IQ4_NL weights rewritten as Q8_0 blocks (UploadWeight), shared
  // likewise.
  std::vector<std::shared_ptr<const std::vector<BlockQ8_0>>> widened_weights_;
};

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_CPU_BACKEND_H_
