#include "engine/kernels/cpu/cpu_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <tuple>
#include <type_traits>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/strings.h"
#include "engine/kernels/cpu/attention.h"
#include "engine/kernels/cpu/attention_bf16.h"
#include "engine/kernels/cpu/dequantize.h"
#include "engine/kernels/cpu/elementwise.h"
#include "engine/kernels/cpu/matmul_q8.h"
#include "engine/kernels/cpu/packed_int8_formats.h"
#include "engine/kernels/cpu/packed_matmul_int8.h"
#include "engine/kernels/cpu/simd.h"
#include "engine/kernels/half.h"

namespace tandem::kernels::cpu {
namespace {

constexpr size_t kAlignment = 64;

// Bump whenever a CPU kernel's rounding changes: daemons of different
// revisions compute other bits with the same mode and instructions, and must
// not hand requests to each other (arithmetic()).
// 2: the bf16 mode's KV cache in bfloat16 and its attention in BF16 dot products.
// 3: that cache in key tiles and value pairs (attention_bf16.h), scores as
//    one lane per key.
// 4: AVX2 builds (without AVX-512) multiply packed panels
//    (packed_matmul_avx2.cc), not the GGUF blocks; AVX-512 builds' bits did
//    not change, so they stay at 3 and keep handing requests to daemons of
//    the revision before.
#if defined(TANDEM_CPU_AVX2) && !defined(TANDEM_CPU_AVX512)
constexpr int kKernelRevision = 4;
#else
constexpr int kKernelRevision = 3;
#endif

// Whether a KV cache of `shape` is kept in bfloat16 (the bf16 mode, where
// its attention kernels exist for the head size and the blocks hold whole
// key tiles) rather than in halves.
bool KvInBf16(MatMulMode mode, const KvCacheShape& shape) {
  return mode == MatMulMode::kBf16 && bf16_attention::Supported(shape.head_dim) &&
         bf16_attention::SupportedBlock(shape.block_size);
}

// The kernels this build has (their arithmetic differs).
#if defined(TANDEM_CPU_AVX512)
constexpr std::string_view kIsa = "avx512";
#elif defined(TANDEM_CPU_AVX2)
constexpr std::string_view kIsa = "avx2";
#else
constexpr std::string_view kIsa = "portable";
#endif

// What a weight's upload derives from it (a packed copy, a widened one),
// made once per process: the two workers of a daemon load the same model,
// and two copies would double the memory and halve the cache both share.
// Keyed by the host data (which outlives every backend that uses it), type
// and shape; one table per T. `make(weight)` returns a shared_ptr<const T>.
template <typename T, typename Make>
std::shared_ptr<const T> SharedPerProcess(const Weight& weight, int variant, Make make) {
  using Key = std::tuple<const void*, DType, int64_t, int64_t, int>;
  static absl::Mutex mu(absl::kConstInit);
  static auto* made =  // guarded by mu
      new absl::flat_hash_map<Key, std::weak_ptr<const T>>();
  const Key key{weight.data, weight.dtype, weight.rows, weight.cols, variant};
  absl::MutexLock lock(&mu);
  if (auto it = made->find(key); it != made->end()) {
    if (std::shared_ptr<const T> live = it->second.lock()) return live;
  }
  std::shared_ptr<const T> result = make(weight);
  (*made)[key] = result;
  return result;
}

// The float panels (variant 0) or the integer ones (1) of a weight.
std::shared_ptr<const PackedWeight> SharedPackedWeight(const Weight& weight, bool int8) {
  return SharedPerProcess<PackedWeight>(weight, int8 ? 1 : 0, [int8](const Weight& w) {
    return std::shared_ptr<const PackedWeight>(int8 ? PackWeightInt8(w) : PackWeight(w));
  });
}

// A Q5_0 or IQ4_NL weight widened to Q8_0 blocks of exactly its values
// (WidenToQ8_0), where it has no panels of its own, so that it takes the
// Q8_0 kernels instead of the dequantizing fallback (Q5_0 is what
// llama-quantize's Q4_K_M writes where rows are not a multiple of 256,
// IQ4_NL what IQ4_XS writes).
std::shared_ptr<const std::vector<BlockQ8_0>> SharedWidenedToQ8_0(const Weight& weight) {
  return SharedPerProcess<std::vector<BlockQ8_0>>(weight, 0, [](const Weight& w) {
    const int64_t blocks = w.rows * w.cols / BlockQ8_0::kElements;
    auto widened = std::make_shared<std::vector<BlockQ8_0>>(static_cast<size_t>(blocks));
    WidenToQ8_0(w.dtype, w.data, blocks, widened->data());
    return std::shared_ptr<const std::vector<BlockQ8_0>>(std::move(widened));
  });
}

}  // namespace

CpuBackend::CpuBackend(std::shared_ptr<ComputePool> pool, LanePriority priority,
                       MatMulMode matmul_mode)
    : pool_(std::move(pool)), lane_(pool_->lane(priority)), matmul_mode_(matmul_mode) {}

CpuBackend::CpuBackend(int threads, MatMulMode matmul_mode)
    : CpuBackend(std::make_shared<ComputePool>(threads < 1 ? 1 : threads),
                 LanePriority::kThroughput, matmul_mode) {}

std::string CpuBackend::name() const {
  return StrCat("cpu (", kIsa, ", ", lane_.size(), " threads, ", MatMulModeName(matmul_mode_),
                " matmul)");
}

std::string CpuBackend::arithmetic() const {
  // q8 multiplies integer panels wherever the build has AVX2 (VNNI's kernel
  // or AVX2's, the same bits); without, the Q4_0, Q4_1 and Q8_0 blocks and
  // float32 panels for the K-quants: other bits. "+int8" marks builds that
  // multiply them by AVX2's kernel (AVX2 CPUs, and AVX-512 ones without
  // VNNI), since those panels came (before, their q8 read the blocks).
#ifdef TANDEM_CPU_INT8_VNNI
  constexpr std::string_view kInt8 = "+vnni";
#else
  constexpr std::string_view kInt8 = "+int8";
#endif
  const bool integer_panels = (matmul_mode_ == MatMulMode::kQ8 && HasInt8Products()) ||
                              (matmul_mode_ == MatMulMode::kQ16 && HasTwoDigitProducts());
  const std::string_view int8 = integer_panels ? kInt8 : "";
  return StrCat("cpu-", kIsa, int8, "/", MatMulModeName(matmul_mode_), "/r", kKernelRevision);
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CpuBackend::Allocate(size_t bytes) {
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* data = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(StrCat("cannot allocate ", bytes, " bytes"));
  }
  return std::make_unique<DeviceBuffer>(data, bytes, [](void* p) { std::free(p); });
}

CpuBackend::UploadPlan CpuBackend::PlanUpload(DType dtype, int64_t rows, int64_t cols) const {
  UploadPlan plan;
  // q8 and q16 multiply packed weights by integer panels where the CPU has
  // the instructions (packed_matmul_int8.h).
  const bool int8_panels = (matmul_mode_ == MatMulMode::kQ8 && HasInt8Products()) ||
                           (matmul_mode_ == MatMulMode::kQ16 && HasTwoDigitProducts());
  // Q5_0 and IQ4_NL become Q8_0 blocks only where they have no panels of
  // their own (unpackable shapes, or q8 without integer panels, which has a
  // block kernel for Q8_0). Their panels decode to the same values and
  // scales, in less than half the memory (and in the f32 and q8 modes give
  // the Q8_0 kernels' bits; bf16 multiplies five-bit quants plus a bias).
  const bool own_panels = WidensToQ8_0(dtype) && (matmul_mode_ != MatMulMode::kQ8 || int8_panels) &&
                          CanPackWeight(dtype, rows, cols);
  plan.widen = WidensToQ8_0(dtype) && !own_panels;
  plan.dtype = plan.widen ? DType::kQ8_0 : dtype;
  // The float32 and bfloat16 modes multiply by packed panels, q8 by integer
  // panels. Without those, q8 reads the GGUF blocks of the types it has
  // block kernels for, and multiplies the others by the float32 panels.
  const bool packable = CanPackWeight(plan.dtype, rows, cols);
  const bool q8_reads_blocks =
      matmul_mode_ == MatMulMode::kQ8 && HasQ8Kernel(plan.dtype) && !(int8_panels && packable);
  plan.pack = !q8_reads_blocks && packable;
  plan.int8 = plan.pack && int8_panels && HasInt8Panels(plan.dtype);
  return plan;
}

int64_t CpuBackend::WeightBytes(DType dtype, int64_t rows, int64_t cols) const {
  const UploadPlan plan = PlanUpload(dtype, rows, cols);
  int64_t bytes = 0;
  if (plan.widen) bytes += static_cast<int64_t>(RowBytes(DType::kQ8_0, cols)) * rows;
  if (plan.pack) {
    bytes += plan.int8 ? PackedWeightBytesInt8(plan.dtype, rows, cols)
                       : PackedWeightBytes(plan.dtype, rows, cols);
  }
  return bytes;
}

absl::StatusOr<Weight> CpuBackend::UploadWeight(DType dtype, int64_t rows, int64_t cols,
                                                const void* host_data) {
  const UploadPlan plan = PlanUpload(dtype, rows, cols);
  Weight weight{dtype, rows, cols, host_data};
  if (plan.widen) {
    widened_weights_.push_back(SharedWidenedToQ8_0(weight));
    weight = Weight{DType::kQ8_0, rows, cols, widened_weights_.back()->data()};
  }
  if (plan.pack) {
    packed_weights_.push_back(SharedPackedWeight(weight, plan.int8));
    weight.packed = packed_weights_.back().get();
  }
  return weight;
}

absl::Status CpuBackend::CreateKvCache(const KvCacheShape& shape) {
  kv_storage_.reset();
  // Anonymous pages read as zeros and become resident only when written, so
  // the process's memory grows with the KV actually used (docs/operations.md)
  // and no uninitialised memory is ever read.
  const size_t bytes = shape.BytesPerBlock() * static_cast<size_t>(shape.blocks);
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError(StrCat("cannot map ", bytes, " bytes of KV cache"));
  }
  kv_storage_ =
      std::make_shared<DeviceBuffer>(data, bytes, [bytes](void* p) { ::munmap(p, bytes); });
  kv_shape_ = shape;
  kv_bf16_ = KvInBf16(matmul_mode_, shape);
  return absl::OkStatus();
}

void CpuBackend::ReleaseKvPages() {
  if (kv_storage_ == nullptr) return;
  // An anonymous private mapping (CreateKvCache): its pages are dropped and
  // read as zeros when next touched.
  ::madvise(kv_storage_->data(), kv_storage_->bytes(), MADV_DONTNEED);
}

void CpuBackend::ReleaseKvBlockPages(std::span<const int32_t> blocks, std::span<const int> layers) {
  if (kv_storage_ == nullptr || blocks.empty()) return;
  // Runs of consecutive block ids are one range of each pool (one call each).
  std::vector<int32_t> sorted(blocks.begin(), blocks.end());
  std::sort(sorted.begin(), sorted.end());
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const size_t block_bytes =
      kv_shape_.BytesPerBlock() / (2 * static_cast<size_t>(kv_shape_.layers));
  const size_t pool_bytes = block_bytes * static_cast<size_t>(kv_shape_.blocks);
  const auto base = reinterpret_cast<uintptr_t>(kv_storage_->data());
  for (size_t run = 0; run < sorted.size();) {
    size_t end = run + 1;
    while (end < sorted.size() && sorted[end] == sorted[end - 1] + 1) ++end;
    for (int layer : layers) {
      for (size_t pool = 2 * static_cast<size_t>(layer); pool < 2 * static_cast<size_t>(layer) + 2;
           ++pool) {  // K, V
        const uintptr_t first =
            base + pool * pool_bytes + static_cast<size_t>(sorted[run]) * block_bytes;
        const uintptr_t last = first + (end - run) * block_bytes;
        // Only pages wholly inside the run: a page it shares holds a
        // neighbouring block's keys.
        const uintptr_t from = (first + page - 1) / page * page, to = last / page * page;
        if (to > from) ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
      }
    }
    run = end;
  }
}

absl::Status CpuBackend::ShareKvCache(const Backend& other) {
  const auto* cpu = dynamic_cast<const CpuBackend*>(&other);
  if (cpu == nullptr || cpu->kv_storage_ == nullptr) {
    return absl::FailedPreconditionError(
        "KV storage can be shared only with a CPU backend that has one");
  }
  if (KvInBf16(matmul_mode_, cpu->kv_shape_) != cpu->kv_bf16_) {
    return absl::FailedPreconditionError(
        StrCat("KV storage can be shared only between CPU backends that store it alike: this one's "
               "mode '",
               MatMulModeName(matmul_mode_), "' and the other's '",
               MatMulModeName(cpu->matmul_mode_), "' differ"));
  }
  kv_storage_ = cpu->kv_storage_;
  kv_shape_ = cpu->kv_shape_;
  kv_bf16_ = cpu->kv_bf16_;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CpuBackend::FreeMemoryBytes() const {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kib) == 1) return kib * 1024;
  }
  return absl::UnavailableError("cannot read MemAvailable from /proc/meminfo");
}

void CpuBackend::CopyToHost(const Matrix& src, float* dst) {
  std::memcpy(dst, src.data, sizeof(float) * static_cast<size_t>(src.rows * src.cols));
}

void CpuBackend::CopyFromHost(const float* src, Matrix dst) {
  std::memcpy(dst.data, src, sizeof(float) * static_cast<size_t>(dst.rows * dst.cols));
}

void CpuBackend::Embed(const Weight& table, std::span<const int32_t> ids, Matrix out) {
  const size_t row_bytes = RowBytes(table.dtype, table.cols);
  const auto* base = static_cast<const uint8_t*>(table.data);
  lane_.ParallelFor(static_cast<int64_t>(ids.size()), [&](int64_t i, int) {
    DequantizeRow(table.dtype, base + static_cast<size_t>(ids[static_cast<size_t>(i)]) * row_bytes,
                  table.cols, out.Row(i));
  });
}

void CpuBackend::MatMul(const Matrix& x, std::span<const Weight* const> weights,
                        std::span<const Weight* const> biases, std::span<const Matrix> outs) {
  cpu::MatMul(matmul_mode_, lane_, matmul_scratch_, x, weights, biases, outs);
}

void CpuBackend::RmsNorm(const Matrix& x, const Weight& weight, float eps, Matrix out) {
  cpu::RmsNorm(lane_, x, static_cast<const float*>(weight.data), eps, out);
}

void CpuBackend::Rope(Matrix x, int heads, int head_dim, std::span<const int32_t> positions,
                      const RopeSpec& rope) {
  cpu::Rope(lane_, x, heads, head_dim, positions, rope);
}

void CpuBackend::CopyKvBlocks(std::span<const std::pair<int32_t, int32_t>> copies) {
  const size_t block_halves = static_cast<size_t>(kv_shape_.block_size) *
                              static_cast<size_t>(kv_shape_.kv_heads * kv_shape_.head_dim);
  const size_t pool_halves = block_halves * static_cast<size_t>(kv_shape_.blocks);
  auto* base = static_cast<uint16_t*>(kv_storage_->data());
  for (const auto& [from, to] : copies) {
    for (size_t pool = 0; pool < 2 * static_cast<size_t>(kv_shape_.layers); ++pool) {  // K, V
      uint16_t* p = base + pool * pool_halves;
      std::memcpy(p + static_cast<size_t>(to) * block_halves,
                  p + static_cast<size_t>(from) * block_halves, block_halves * sizeof(uint16_t));
    }
  }
}

void CpuBackend::WriteKv(int layer, const Matrix& k, const Matrix& v,
                         std::span<const int32_t> slots) {
  const int64_t per_token = int64_t{kv_shape_.kv_heads} * kv_shape_.head_dim;
  const int64_t per_layer_pool = int64_t{kv_shape_.blocks} * kv_shape_.block_size * per_token;
  auto* base = static_cast<uint16_t*>(kv_storage_->data());
  uint16_t* k_pool = base + int64_t{2} * layer * per_layer_pool;
  uint16_t* v_pool = k_pool + per_layer_pool;
#ifdef TANDEM_CPU_BF16_ATTENTION
  if (kv_bf16_) {  // key tiles and value pairs (attention_bf16.h), rounded to nearest even
    const int block_size = kv_shape_.block_size, head_dim = kv_shape_.head_dim;
    for (size_t r = 0; r < slots.size(); ++r) {
      const int64_t block = slots[r] / block_size;
      const int slot = slots[r] % block_size;
      for (int h = 0; h < kv_shape_.kv_heads; ++h) {
        const int64_t head =
            bf16_attention::HeadOffset(block, h, kv_shape_.kv_heads, block_size, head_dim);
        const float* kr = k.Row(static_cast<int64_t>(r)) + int64_t{h} * head_dim;
        const float* vr = v.Row(static_cast<int64_t>(r)) + int64_t{h} * head_dim;
        bf16_attention::WithHeadDim(head_dim, [&](auto dim) {
          bf16_attention::StoreKey<dim()>(kr, slot, k_pool + head);
          bf16_attention::StoreValue<dim()>(vr, slot, v_pool + head);
        });
      }
    }
    return;
  }
#endif
  for (size_t r = 0; r < slots.size(); ++r) {
    const float* kr = k.Row(static_cast<int64_t>(r));
    const float* vr = v.Row(static_cast<int64_t>(r));
    uint16_t* kd = k_pool + int64_t{slots[r]} * per_token;
    uint16_t* vd = v_pool + int64_t{slots[r]} * per_token;
    int64_t i = 0;
#ifdef TANDEM_CPU_AVX512
    // The hardware conversion rounds to nearest even, as FloatToHalf does
    // (they differ only in NaN payloads).
    for (; i + 16 <= per_token; i += 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(kd + i),
                          _mm512_cvtps_ph(_mm512_loadu_ps(kr + i), _MM_FROUND_TO_NEAREST_INT));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(vd + i),
                          _mm512_cvtps_ph(_mm512_loadu_ps(vr + i), _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < per_token; ++i) {
      kd[i] = FloatToHalf(kr[i]);
      vd[i] = FloatToHalf(vr[i]);
    }
  }
}

void CpuBackend::Attention(int layer, const Matrix& q, const AttentionShape& shape,
                           std::span<const AttentionSpan> spans, Matrix out) {
  const int64_t per_layer_pool =
      int64_t{kv_shape_.blocks} * kv_shape_.block_size * kv_shape_.kv_heads * kv_shape_.head_dim;
  const auto* base = static_cast<const uint16_t*>(kv_storage_->data());
  KvLayerView view;
  view.k = base + int64_t{2} * layer * per_layer_pool;
  view.v = view.k + per_layer_pool;
  view.block_size = kv_shape_.block_size;
  view.kv_heads = kv_shape_.kv_heads;
  view.head_dim = kv_shape_.head_dim;
  view.bf16 = kv_bf16_;
  PagedAttention(lane_, attention_scratch_, view, q, shape, spans, out);
}

void CpuBackend::SiluMul(const Matrix& gate, const Matrix& up, Matrix out) {
  cpu::SiluMul(lane_, gate, up, out);
}

void CpuBackend::GeluMul(const Matrix& gate, const Matrix& up, Matrix out) {
  cpu::GeluMul(lane_, gate, up, out);
}

void CpuBackend::Scale(Matrix x, float factor) { cpu::Scale(lane_, x, factor); }

void CpuBackend::Softcap(Matrix x, float cap) { cpu::Softcap(lane_, x, cap); }

void CpuBackend::Add(Matrix acc, const Matrix& x) { cpu::Add(lane_, acc, x); }

void CpuBackend::GatherRows(const Matrix& x, std::span<const int32_t> rows, Matrix out) {
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(out.Row(static_cast<int64_t>(i)), x.Row(rows[i]),
                sizeof(float) * static_cast<size_t>(x.cols));
  }
}

void CpuBackend::ScatterAddRows(Matrix acc, std::span<const int32_t> rows,
                                std::span<const float> weights, const Matrix& x) {
  lane_.ParallelFor(static_cast<int64_t>(rows.size()), [&](int64_t i, int) {
    float* a = acc.Row(rows[static_cast<size_t>(i)]);
    const float* v = x.Row(i);
    const float w = weights[static_cast<size_t>(i)];
    for (int64_t c = 0; c < x.cols; ++c) a[c] += w * v[c];
  });
}

}  // namespace tandem::kernels::cpu
