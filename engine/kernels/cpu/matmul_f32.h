// Matrix products in float32: the weights' exact dequantized values times the
// float activations.
//
// Q8_0/Q4_0/Q4_1 weights are decoded block by block inside the dot product
// (no scratch). With AVX-512 a block's 32 weights are decoded exactly by a
// 16-entry table lookup (table[q] = d q + m) and multiplied in float; with
// AVX2, sum_j x_j (d q_j + m) = d * sum_j x_j q_j + m * sum_j x_j, where the
// per-block activation sums are computed once per row. Other types are dequantized a few rows at a
// time into scratch and multiplied with a plain float dot product.
#ifndef TANDEM_ENGINE_KERNELS_CPU_MATMUL_F32_H_
#define TANDEM_ENGINE_KERNELS_CPU_MATMUL_F32_H_

#include <cstdint>
#include <vector>

#include "engine/kernels/backend.h"

namespace tandem::kernels::cpu {

// True for the types with a fused (block-decoding) float kernel.
bool HasFusedF32Kernel(DType dtype);
// Whether the fused kernels of this build read per-block activation sums
// (the AVX2 and portable ones do; the AVX-512 one decodes whole weights).
bool FusedF32KernelNeedsBlockSums();

// sums[b] = sum of x[32b .. 32b+32), in a fixed order. elements % 32 == 0.
void BlockSums(const float* x, int64_t elements, float* sums);

// out[r][n] (+ bias[n]) for every row r of x and weight rows n in [n0, n1).
// REQUIRES: HasFusedF32Kernel(weight.dtype); block_sums holds BlockSums of
// every row of x, x.cols / 32 per row.
void MatMulF32FusedRows(const Weight& weight, const Matrix& x, const float* block_sums, int64_t n0,
                        int64_t n1, const float* bias, const Matrix& out);

// The same for any weight type, through `scratch` (grown as needed).
void MatMulF32DequantRows(const Weight& weight, const Matrix& x, int64_t n0, int64_t n1,
                          const float* bias, std::vector<float>& scratch, const Matrix& out);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_MATMUL_F32_H_
