// Matrix products of float activations with weights in any supported type.
//
// For Q8_0, Q4_0 and Q4_1 weights, each activation row is first quantized to
// 8-bit blocks of 32 (a scale per block, as llama.cpp does) and the products
// are integer dot products per block, accumulated in float in block order.
// Other weight types are dequantized to float a few rows at a time and
// multiplied in float.
//
// Batch invariance: out[r][n] is computed by the same instruction sequence
// from activation row r and weight row n whatever the number of rows, their
// order, the tiling or the thread that runs it.
#ifndef TANDEM_ENGINE_KERNELS_CPU_MATMUL_H_
#define TANDEM_ENGINE_KERNELS_CPU_MATMUL_H_

#include <cstdint>
#include <vector>

#include "engine/kernels/backend.h"
#include "engine/kernels/cpu/thread_pool.h"

namespace tandem::kernels::cpu {

// An activation row quantized to 8 bits in blocks of 32 values.
struct ActivationBlock {
  float d;          // scale: value = d * q (rounded through half precision)
  float s;          // d * sum(q), rounded through half precision (for Q4_1)
  int8_t q[32];
};

// True when `dtype` weights use the integer path (activations quantized).
bool UsesQuantizedActivations(DType dtype);

// Quantizes `elements` floats (a multiple of 32) into blocks.
void QuantizeActivationRow(const float* x, int64_t elements, ActivationBlock* out);

// Dot product of one weight row (blocks of `dtype`) with one quantized
// activation row, over `blocks` blocks of 32.
float DotQuantizedRow(DType dtype, const void* weight_row, const ActivationBlock* act,
                      int64_t blocks);

// Per-thread scratch, reused across calls to avoid allocation in the hot path.
struct MatMulScratch {
  std::vector<ActivationBlock> activations;
  std::vector<std::vector<float>> dequantized;  // one per pool thread
};

// outs[w] = x * weights[w]^T (+ bias). See backend.h for the contract.
void MatMul(ThreadPool& pool, MatMulScratch& scratch, const Matrix& x,
            std::span<const Weight* const> weights, std::span<const Weight* const> biases,
            std::span<const Matrix> outs);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_MATMUL_H_
