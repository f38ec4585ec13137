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

// The 32 five-bit integers (0-31) of a Q5_0 or Q5_1 block: element j's low
// four bits in the low nibble of qs[j] (j < 16) or the high one of
// qs[j - 16], its fifth in bit j of qh read as a little-endian uint32.
void FiveBitValues(const uint8_t* qs, const uint8_t* qh_bytes, int out[32]);

// Whether blocks of `type` can be rewritten as Q8_0 blocks of exactly the
// same values: Q5_0 (its block's half-precision scale times an integer in
// [-16, 15]) and IQ4_NL (the scale times one of 16 levels in [-127, 113]),
// each a Q8_0 block with the same scale and the integers as int8 (34 bytes
// a block, not 22 or 18).
bool WidensToQ8_0(DType type);
// REQUIRES: WidensToQ8_0(type); `src` holds n_blocks blocks of `type`.
void WidenToQ8_0(DType type, const void* src, int64_t n_blocks, BlockQ8_0* dst);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_DEQUANTIZE_H_
