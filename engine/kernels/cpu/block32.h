// The weight types whose blocks are not 32-input blocks of one scale (the
// K-quants, IQ4_XS), that carry a fifth bit (Q5_1) or map their quants to
// levels (IQ4_NL), read as 32-input blocks of one common form, which the
// packed kernels store per panel:
//
//   w[j] = (d * scale[j / 16]) * v(q[j]) - dmin * min        j = 0..31
//
// d and dmin are half floats; scale, min and q small integers; v(q) = q,
// except for IQ4_NL and IQ4_XS, where q is an index and v(q) =
// kIq4NlLevels[q]. Each product is exact in float32 (at most 11 + 8 + 7
// significant bits), so a kernel that computes it this way gets
// DequantizeRow's weight bit for bit.
#ifndef TANDEM_ENGINE_KERNELS_CPU_BLOCK32_H_
#define TANDEM_ENGINE_KERNELS_CPU_BLOCK32_H_

#include <cstdint>

#include "engine/kernels/dtype.h"

namespace tandem::kernels::cpu {

struct Block32 {
  uint16_t d = 0;
  uint16_t dmin = 0;  // a half; 0 (and min 0) for types without a minimum
  int8_t scale[2] = {1, 1};
  uint8_t min = 0;
  int8_t q[32] = {};
};

// Q4_K, Q5_K and Q5_1: one scale for the 32 inputs, a minimum, and quants
// in [0, 15] (Q4_K) or [0, 31]. Q6_K: a scale per 16 inputs, no minimum,
// quants in [-32, 31]. IQ4_NL (scale 1) and IQ4_XS: one scale, no minimum,
// level indices in [0, 15].
bool HasBlock32(DType type);

// Block b (inputs [32b, 32b + 32)) of a row of `type` starting at `row`.
// REQUIRES: HasBlock32(type).
Block32 ReadBlock32(DType type, const uint8_t* row, int64_t b);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_BLOCK32_H_
