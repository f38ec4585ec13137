#include "engine/kernels/cpu/matmul.h"

#include <algorithm>

#include "common/strings.h"
#include "engine/kernels/cpu/matmul_f32.h"

namespace tandem::kernels::cpu {
namespace {

// Weight rows handled by one task: a task's weight rows stay in L1 while they
// meet every activation row, and narrow projections still split into enough
// tasks to balance the threads.
constexpr int64_t kRowsPerTask = 16;

bool UsesQ8(MatMulMode mode, DType dtype) {
  return mode == MatMulMode::kQ8 &&
         (dtype == DType::kQ8_0 || dtype == DType::kQ4_0 || dtype == DType::kQ4_1);
}

}  // namespace

absl::StatusOr<MatMulMode> ParseMatMulMode(std::string_view name) {
  if (name == "f32") return MatMulMode::kF32;
  if (name == "q8") return MatMulMode::kQ8;
  return absl::InvalidArgumentError(StrCat("unknown CPU matmul mode '", name, "' (f32 or q8)"));
}

std::string_view MatMulModeName(MatMulMode mode) { return mode == MatMulMode::kF32 ? "f32" : "q8"; }

void MatMul(MatMulMode mode, ThreadPool& pool, MatMulScratch& scratch, const Matrix& x,
            std::span<const Weight* const> weights, std::span<const Weight* const> biases,
            std::span<const Matrix> outs) {
  const int64_t rows = x.rows;
  const int64_t k = x.cols;
  const int64_t blocks = k / 32;
  bool any_q8 = false;
  bool any_fused = false;
  for (const Weight* w : weights) {
    any_q8 |= UsesQ8(mode, w->dtype);
    any_fused |= !UsesQ8(mode, w->dtype) && HasFusedF32Kernel(w->dtype);
  }
  // Per-row preparation shared by every weight of the call.
  if (any_q8) scratch.activations.resize(static_cast<size_t>(rows * blocks));
  if (any_fused) scratch.block_sums.resize(static_cast<size_t>(rows * blocks));
  if (any_q8 || any_fused) {
    pool.ParallelFor(rows, [&](int64_t r, int) {
      if (any_q8) QuantizeActivationRow(x.Row(r), k, scratch.activations.data() + r * blocks);
      if (any_fused) BlockSums(x.Row(r), k, scratch.block_sums.data() + r * blocks);
    });
  }
  scratch.dequantized.resize(static_cast<size_t>(pool.size()));

  // Tasks: (weight, chunk of kRowsPerTask output features), numbered densely.
  std::vector<int64_t> first_task(weights.size() + 1, 0);
  for (size_t w = 0; w < weights.size(); ++w) {
    first_task[w + 1] = first_task[w] + (weights[w]->rows + kRowsPerTask - 1) / kRowsPerTask;
  }
  pool.ParallelFor(first_task.back(), [&](int64_t task, int thread) {
    size_t w = 0;
    while (task >= first_task[w + 1]) ++w;
    const Weight& weight = *weights[w];
    const int64_t n0 = (task - first_task[w]) * kRowsPerTask;
    const int64_t n1 = std::min(weight.rows, n0 + kRowsPerTask);
    const float* bias = w < biases.size() && biases[w] != nullptr
                            ? static_cast<const float*>(biases[w]->data)
                            : nullptr;
    if (UsesQ8(mode, weight.dtype)) {
      MatMulQ8Rows(weight, scratch.activations.data(), rows, n0, n1, bias, outs[w]);
    } else if (HasFusedF32Kernel(weight.dtype)) {
      MatMulF32FusedRows(weight, x, scratch.block_sums.data(), n0, n1, bias, outs[w]);
    } else {
      MatMulF32DequantRows(weight, x, n0, n1, bias,
                           scratch.dequantized[static_cast<size_t>(thread)], outs[w]);
    }
  });
}

}  // namespace tandem::kernels::cpu
