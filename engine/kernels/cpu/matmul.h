// Matrix products of float activations with weights in any supported type,
// spread over a thread pool (dispatch only; the kernels are in matmul_f32 and
// matmul_q8).
//
// Batch invariance: out[r][n] is computed by the same instruction sequence
// from activation row r and weight row n whatever the number of rows, their
// order, the tiling or the thread that runs it. Work is split by output
// feature (weight rows), never along the reduction.
#ifndef TANDEM_ENGINE_KERNELS_CPU_MATMUL_H_
#define TANDEM_ENGINE_KERNELS_CPU_MATMUL_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kernels/backend.h"
#include "engine/kernels/cpu/compute_pool.h"
#include "engine/kernels/cpu/matmul_q8.h"
#include "engine/kernels/cpu/two_digit_activations.h"

namespace tandem::kernels::cpu {

enum class MatMulMode {
  // Dequantized weights times float32 activations: the model's own arithmetic
  // (logits within ~1e-2 of a float64 evaluation). The default.
  kF32,
  // 8-bit activations (llama.cpp's CPU scheme) times the exact quants as
  // integer dot products: every packable quantized type where the build has
  // AVX2 or AVX-512 VNNI (packed_matmul_int8.h), else Q8_0/Q4_0/Q4_1 blocks; F16 and
  // BF16 weights as kF32. Fastest; the activation rounding moves logits by
  // ~0.5 on small models.
  kQ8,
  // bfloat16 activations times the exact quants (or BF16 weights) of packed
  // weights, summed in float32 (packed_matmul.h): twice the float32 rate on
  // CPUs with AVX-512 BF16; F16 and unpacked weights as kF32.
  kBf16,
  // 16-bit activations in two 8-bit digits (two_digit_activations.h) times
  // the exact quants on q8's integer panels, two integer dot products per
  // quad (packed_matmul_int8.h): CPUs with AVX-512 VNNI; F16, BF16 and
  // unpacked weights as kF32. Logits within ~0.05 of a float64 evaluation
  // (f32: ~0.02, bf16: ~0.4, q8: ~1.4 on the default model).
  kQ16,
};

// "f32", "bf16", "q8", "q16", or "auto" (product_rates.h: the fastest of
// f32, q16 and bf16, the more exact near parity). bf16 and q16 without the
// instructions are errors.
absl::StatusOr<MatMulMode> ParseMatMulMode(std::string_view name);
std::string_view MatMulModeName(MatMulMode mode);

// Per-call scratch, reused across calls to keep allocation off the hot path.
struct MatMulScratch {
  std::vector<ActivationBlock> activations;          // kQ8
  std::vector<float> block_sums;                     // kF32 fused kernels
  std::vector<std::vector<float>> dequantized;       // one per pool thread
  std::vector<uint16_t> bf16_activations;            // kBf16
  std::vector<TwoDigitBlock> two_digit_activations;  // kQ16
  std::vector<float> bf16_block_sums;                // kBf16
};

// outs[w] = x * weights[w]^T (+ biases[w]). See backend.h for the contract.
void MatMul(MatMulMode mode, ComputeLane& pool, MatMulScratch& scratch, const Matrix& x,
            std::span<const Weight* const> weights, std::span<const Weight* const> biases,
            std::span<const Matrix> outs);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_MATMUL_H_
