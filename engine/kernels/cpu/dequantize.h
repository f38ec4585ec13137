// Scalar dequantization of weight rows to float32: the reference definition of
// every block format, used for embedding lookups, for weight types that have
// no integer kernel, and by tests.
#ifndef TANDEM_ENGINE_KERNELS_CPU_DEQUANTIZE_H_
#define TANDEM_ENGINE_KERNELS_CPU_DEQUANTIZE_H_

#include <cstdint>

#include "engine/kernels/dtype.h"

namespace tandem::kernels::cpu {

// Writes `elements` floats decoded from `src` (which holds that many elements
// of `type`) to `dst`. REQUIRES: elements % Info(type).block_elements == 0.
void DequantizeRow(DType type, const void* src, int64_t elements, float* dst);

// Rewrites Q5_0 blocks as Q8_0 blocks of the same values: a Q5_0 element is
// its block's half-precision scale times an integer in [-16, 15], which a
// Q8_0 block holds exactly with the same scale (34 bytes a block, not 22).
void WidenQ5_0ToQ8_0(const BlockQ5_0* src, int64_t n_blocks, BlockQ8_0* dst);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_DEQUANTIZE_H_
