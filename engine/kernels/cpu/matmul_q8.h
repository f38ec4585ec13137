// Matrix products with 8-bit quantized activations (llama.cpp's scheme): each
// activation row is quantized in blocks of 32 to int8 with a per-block scale,
// and products with Q8_0/Q4_0/Q4_1 weights are exact integer dot products per
// block, accumulated in float in block order. About twice as fast as the f32
// kernels; the activation rounding moves logits by ~0.5 on small models.
#ifndef TANDEM_ENGINE_KERNELS_CPU_MATMUL_Q8_H_
#define TANDEM_ENGINE_KERNELS_CPU_MATMUL_Q8_H_

#include <cstdint>

#include "engine/kernels/backend.h"

namespace tandem::kernels::cpu {

struct ActivationBlock {
  float d;          // scale: value = d * q (rounded through half precision)
  float s;          // d * sum(q), rounded through half precision (for Q4_1)
  float ds;         // d * sum(q) in float32 (the integer panels' minimum term)
  int16_t sums[2];  // sum(q) over inputs 0-15 and 16-31 (exact)
  int8_t q[32];
};

// Whether MatMulQ8Rows takes weights of `dtype` (the q8 mode multiplies the
// other types by the float32 kernels).
bool HasQ8Kernel(DType dtype);

// Quantizes `elements` floats (a multiple of 32) into blocks: q =
// nearbyint(x * 127 / amax) per block, always within -127..127 (a NaN
// product becomes 0, an infinite one the limit).
void QuantizeActivationRow(const float* x, int64_t elements, ActivationBlock* out);

// out[r][n] (+ bias[n]) for every activation row r < rows and weight rows
// n in [n0, n1). REQUIRES: weight.dtype is Q8_0, Q4_0 or Q4_1;
// `activations` holds rows * weight.cols / 32 blocks.
void MatMulQ8Rows(const Weight& weight, const ActivationBlock* activations, int64_t rows,
                  int64_t n0, int64_t n1, const float* bias, const Matrix& out);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_MATMUL_Q8_H_
