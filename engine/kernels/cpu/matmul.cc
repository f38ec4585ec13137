#include "engine/kernels/cpu/matmul.h"

#include <algorithm>

#include "common/strings.h"
#include "engine/kernels/cpu/matmul_f32.h"
#include "engine/kernels/cpu/matmul_q8.h"
#include "engine/kernels/cpu/packed_matmul.h"
#include "engine/kernels/cpu/packed_matmul_int8.h"
#include "engine/kernels/cpu/product_rates.h"

namespace tandem::kernels::cpu {
namespace {

// Tasks per pool thread, and the smallest task (in weight rows).
constexpr int64_t kTasksPerThread = 2;
constexpr int64_t kMinRowsPerTask = 16;
// The most multiply-adds in one task when the product has many activation
// rows (a prompt chunk): about 0.1 ms on one core, the bound on how long a
// decode step that preempts a prefill step waits (compute_pool.h). Decode
// products (few rows) stay in a few long ranges, which stream through the
// weights with the prefetcher's help.
constexpr int64_t kMaxMultiplyAddsPerTask = int64_t{8} << 20;
static_assert(kMinRowsPerTask % kPanelWidth == 0, "tasks cover whole packed panels");
// A prompt's activation rows are split into blocks of about this many
// bytes of float32 activations (at most one more tile of rows), and each
// task takes one block times a range of weight rows: the block stays in L2
// while the task's panels pass over it. Without it every task (cut to 16
// weight rows by kMaxMultiplyAddsPerTask) streamed the whole activation
// matrix (3 MB for a 512-token chunk of a 1,536-wide input) from L3, and a
// 512-token prompt's products ran at ~54% of the float32 FMA peak on an
// Intel Xeon, against ~73% for 64 rows.
constexpr int64_t kActivationBlockBytes = int64_t{256} << 10;
// Block heights are multiples of this (the kernels' tiles of rows), and at
// least kMinActivationBlockRows rows: wide inputs (8,192 in a 1B model's
// down projection) would otherwise get blocks of 16 rows, each of which
// decodes every weight again. Measured on the Intel Xeon, 2 layers of the
// 1B shape at 512 rows in f32: 210-220 GFLOP/s with 16, 233-241 with 32,
// 222-228 with 64 (which cost SmolLM2's shapes ~5%).
constexpr int64_t kActivationBlockRowMultiple = 16;
constexpr int64_t kMinActivationBlockRows = 32;

// In q8 mode a packed weight holds integer panels where the CPU has the
// instructions (CpuBackend::UploadWeight), else float32 ones.
bool UsesInt8Panels(MatMulMode mode, const Weight& w) {
  return mode == MatMulMode::kQ8 && HasInt8Products() && w.packed != nullptr &&
         HasInt8Panels(w.dtype);
}
// Whether the weight is multiplied by bfloat16 products (the bf16 mode's
// packed weights but F16's, whose float32 panels keep them exact).
// (ParseMatMulMode refuses bf16 without the instructions; a backend made
// with it anyway gets the float32 panels, not the bf16 kernels' no-op.)
bool UsesBf16Panels(MatMulMode mode, const Weight& w) {
  return mode == MatMulMode::kBf16 && HasBf16Products() && w.packed != nullptr &&
         HasBf16Panels(w.dtype);
}
// Whether the weight is multiplied by two-digit activations: the q16 mode's
// integer panels (which it packs as q8 does, only where the CPU has VNNI).
bool UsesTwoDigitPanels(MatMulMode mode, const Weight& w) {
  return mode == MatMulMode::kQ16 && HasTwoDigitProducts() && w.packed != nullptr &&
         HasInt8Panels(w.dtype);
}
// Whether the weight is multiplied by 8-bit activations (integer panels or
// the block kernels).
bool UsesQ8(MatMulMode mode, const Weight& w) {
  return UsesInt8Panels(mode, w) ||
         (mode == MatMulMode::kQ8 && w.packed == nullptr && HasQ8Kernel(w.dtype));
}

// `mode` where the build has its instructions, else an error naming them.
absl::StatusOr<MatMulMode> WhereBuilt(MatMulMode mode, bool built, std::string_view instructions) {
  if (built) return mode;
  return absl::InvalidArgumentError(StrCat("CPU matmul mode '", MatMulModeName(mode), "' needs ",
                                           instructions,
                                           " instructions, which this build's target CPU lacks "
                                           "(use f32)"));
}

}  // namespace

absl::StatusOr<MatMulMode> ParseMatMulMode(std::string_view name) {
  if (name == "f32") return MatMulMode::kF32;
  if (name == "auto") return AutoMatMulMode().mode;
  if (name == "q8") return MatMulMode::kQ8;
  if (name == "q16") return WhereBuilt(MatMulMode::kQ16, HasTwoDigitProducts(), "AVX-512 VNNI");
  if (name == "bf16") return WhereBuilt(MatMulMode::kBf16, HasBf16Products(), "AVX-512 BF16");
  return absl::InvalidArgumentError(
      StrCat("unknown CPU matmul mode '", name, "' (auto, f32, bf16, q8 or q16)"));
}

std::string_view MatMulModeName(MatMulMode mode) {
  switch (mode) {
    case MatMulMode::kF32:
      return "f32";
    case MatMulMode::kQ8:
      return "q8";
    case MatMulMode::kBf16:
      return "bf16";
    case MatMulMode::kQ16:
      return "q16";
  }
  return "?";
}

void MatMul(MatMulMode mode, ComputeLane& pool, MatMulScratch& scratch, const Matrix& x,
            std::span<const Weight* const> weights, std::span<const Weight* const> biases,
            std::span<const Matrix> outs) {
  const int64_t rows = x.rows;
  const int64_t k = x.cols;
  const int64_t blocks = k / 32;
  bool any_q8 = false;
  bool any_fused = false;
  bool any_bf16 = false;
  bool any_two_digit = false;
  for (const Weight* w : weights) {
    any_q8 |= UsesQ8(mode, *w);
    any_bf16 |= UsesBf16Panels(mode, *w);
    any_two_digit |= UsesTwoDigitPanels(mode, *w);
    any_fused |= !UsesQ8(mode, *w) && w->packed == nullptr && HasFusedF32Kernel(w->dtype) &&
                 FusedF32KernelNeedsBlockSums();
  }
  // Per-row preparation shared by every weight of the call.
  if (any_q8) scratch.activations.resize(static_cast<size_t>(rows * blocks));
  if (any_fused) scratch.block_sums.resize(static_cast<size_t>(rows * blocks));
  if (any_bf16) {
    scratch.bf16_activations.resize(static_cast<size_t>(rows * k));
    scratch.bf16_block_sums.resize(static_cast<size_t>(rows * blocks));
  }
  if (any_two_digit) scratch.two_digit_activations.resize(static_cast<size_t>(rows * blocks));
  if (any_q8 || any_fused || any_bf16 || any_two_digit) {
    pool.ParallelFor(rows, [&](int64_t r, int) {
      if (any_q8) QuantizeActivationRow(x.Row(r), k, scratch.activations.data() + r * blocks);
      if (any_two_digit) {
        QuantizeTwoDigitRow(x.Row(r), k, scratch.two_digit_activations.data() + r * blocks);
      }
      if (any_fused) BlockSums(x.Row(r), k, scratch.block_sums.data() + r * blocks);
      if (any_bf16) {
        RoundActivationsToBf16(x.Row(r), k, scratch.bf16_activations.data() + r * k,
                               scratch.bf16_block_sums.data() + r * blocks);
      }
    });
  }
  scratch.dequantized.resize(static_cast<size_t>(pool.size()));

  // Tasks: contiguous ranges of the weights' rows, taken together. Few large
  // ranges stream each thread through memory sequentially (small tasks
  // cost decode 30% in lost prefetching); a few per thread still balance.
  // Each weight starts at a multiple of kMinRowsPerTask in the joint range,
  // so every task boundary falls on a whole packed panel of every weight,
  // whatever the batch.
  std::vector<int64_t> first_row(weights.size() + 1, 0);
  for (size_t w = 0; w < weights.size(); ++w) {
    first_row[w + 1] =
        first_row[w] + (weights[w]->rows + kMinRowsPerTask - 1) / kMinRowsPerTask * kMinRowsPerTask;
  }
  const int64_t total = first_row.back();
  // Activation row blocks (one for decode steps and short chunks): as many
  // as keep each near kActivationBlockBytes, their heights rounded up to a
  // whole tile of rows (the last block takes the rest).
  const int64_t most_rows =
      std::max(kMinActivationBlockRows,
               kActivationBlockBytes / std::max<int64_t>(1, k * int64_t{sizeof(float)}));
  const int64_t row_blocks_wanted = std::max<int64_t>(1, (rows + most_rows - 1) / most_rows);
  const int64_t height = (rows + row_blocks_wanted - 1) / row_blocks_wanted;
  const int64_t row_block_rows = std::max<int64_t>(
      1, std::min(rows, (height + kActivationBlockRowMultiple - 1) / kActivationBlockRowMultiple *
                            kActivationBlockRowMultiple));
  const int64_t row_blocks = (rows + row_block_rows - 1) / row_block_rows;
  const int64_t tasks_wanted = int64_t{pool.size()} * kTasksPerThread;
  const int64_t rows_per_budget =
      kMaxMultiplyAddsPerTask / std::max<int64_t>(1, row_block_rows * k);
  const int64_t chunk = std::max<int64_t>(
      kMinRowsPerTask, std::min((total + tasks_wanted - 1) / tasks_wanted, rows_per_budget) /
                           kMinRowsPerTask * kMinRowsPerTask);
  const int64_t chunks = (total + chunk - 1) / chunk;
  // Tasks in row-block-major order: the threads work through one block's
  // weight ranges together, so the block is read into each one's L2 once.
  pool.ParallelFor(row_blocks * chunks, [&](int64_t task, int thread) {
    const int64_t r0 = task / chunks * row_block_rows;
    const int64_t block_rows = std::min(row_block_rows, rows - r0);
    const int64_t begin = task % chunks * chunk;
    const int64_t end = std::min(total, begin + chunk);
    const Matrix block_x{x.Row(r0), block_rows, k};
    auto block_out = [&](size_t w) { return Matrix{outs[w].Row(r0), block_rows, outs[w].cols}; };
    for (size_t w = 0; w < weights.size(); ++w) {
      const int64_t n0 = std::max(begin, first_row[w]) - first_row[w];
      const Weight& weight = *weights[w];
      const int64_t n1 = std::min(std::min(end, first_row[w + 1]) - first_row[w], weight.rows);
      if (n0 >= n1) continue;
      const float* bias = w < biases.size() && biases[w] != nullptr
                              ? static_cast<const float*>(biases[w]->data)
                              : nullptr;
      const Matrix out = block_out(w);
      std::vector<float>& dequantized = scratch.dequantized[static_cast<size_t>(thread)];
      if (UsesTwoDigitPanels(mode, weight)) {
        MatMulPackedTwoDigitRows(*static_cast<const PackedWeight*>(weight.packed),
                                 scratch.two_digit_activations.data() + r0 * blocks, block_rows, n0,
                                 n1, bias, out);
      } else if (UsesInt8Panels(mode, weight)) {
        MatMulPackedInt8Rows(*static_cast<const PackedWeight*>(weight.packed),
                             scratch.activations.data() + r0 * blocks, block_rows, n0, n1, bias,
                             out);
      } else if (UsesQ8(mode, weight)) {
        MatMulQ8Rows(weight, scratch.activations.data() + r0 * blocks, block_rows, n0, n1, bias,
                     out);
      } else if (UsesBf16Panels(mode, weight)) {
        MatMulPackedBf16Rows(*static_cast<const PackedWeight*>(weight.packed),
                             scratch.bf16_activations.data() + r0 * k,
                             scratch.bf16_block_sums.data() + r0 * blocks, block_rows, n0, n1, bias,
                             dequantized, out);
      } else if (weight.packed != nullptr) {
        MatMulPackedRows(*static_cast<const PackedWeight*>(weight.packed), block_x, n0, n1, bias,
                         dequantized, out);
      } else if (HasFusedF32Kernel(weight.dtype)) {
        // (Block sums only where the kernel needs them, which sized them
        // for this call: none to offset otherwise.)
        const float* block_sums = any_fused ? scratch.block_sums.data() + r0 * blocks : nullptr;
        MatMulF32FusedRows(weight, block_x, block_sums, n0, n1, bias, out);
      } else {
        MatMulF32DequantRows(weight, block_x, n0, n1, bias, dequantized, out);
      }
    }
  });
}

}  // namespace tandem::kernels::cpu
