// The q16 mode's activations: each block of 32 as 16-bit integers written in
// two signed 8-bit digits, so that the integer panels of the q8 mode
// (packed_matmul_int8.h) multiply them with two vpdpbusd a quad where q8
// takes one. q8's single digit keeps 1/254 of a block's largest magnitude,
// which on the default model's FFN inputs (a few large channels set the
// scale) changes greedy answers; two digits keep 1/65,278 of it, finer than
// bfloat16's 2^-9 of each element for every element above ~1/128 of its
// block's largest.
#ifndef TANDEM_ENGINE_KERNELS_CPU_TWO_DIGIT_ACTIVATIONS_H_
#define TANDEM_ENGINE_KERNELS_CPU_TWO_DIGIT_ACTIVATIONS_H_

#include <cstdint>

namespace tandem::kernels::cpu {

// The largest |Q|: 127 * 256 + 127, the most two digits within -127..127
// (high) and -128..127 (low) can write.
inline constexpr int kTwoDigitLimit = 32639;

// value = d * Q, Q = 256 * hi + lo.
struct TwoDigitBlock {
  float d;          // amax / kTwoDigitLimit (float32)
  float ds;         // d * sum(Q) in float32 (the integer panels' minimum term)
  int32_t sums[2];  // sum(Q) over inputs 0-15 and 16-31 (exact)
  int8_t hi[32];    // (Q + 128) >> 8, within -127..127
  int8_t lo[32];    // Q - 256 * hi, within -128..127
};

// Quantizes `elements` floats (a multiple of 32) into blocks: Q =
// nearbyint(x * kTwoDigitLimit / amax) per block, within the limit (a NaN
// product becomes 0, an infinite one the limit; NaN inputs do not count
// toward amax), then split into its digits.
void QuantizeTwoDigitRow(const float* x, int64_t elements, TwoDigitBlock* out);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_TWO_DIGIT_ACTIVATIONS_H_
