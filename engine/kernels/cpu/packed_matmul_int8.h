// The q8 mode's products over packed panels: 8-bit activations (matmul_q8.h's
// blocks of 32) times the exact quants of every packable weight type, as
// integer dot products. Two kernels, one arithmetic: AVX-512 VNNI's
// (packed_matmul_int8.cc: 64 multiply-adds an instruction, four per lane,
// against the bfloat16 kernels' two per lane after decoding each quant to a
// float) and AVX2's (packed_matmul_int8_avx2.cc: vpmaddubsw, 32 an
// instruction, against 8 for a float32 FMA after decoding). The formats
// are in packed_int8_formats.h.
//
// Layout: the panels of packed_matmul.h (16 output rows, the same headers
// and scales in the same places), with each block's quants stored unsigned
// (the quant plus a bias the kernel takes back off) and reordered so that a
// 32-bit lane holds four consecutive inputs of its row, the order vpdpbusd
// takes them in. "Quad vector" j of a block holds inputs 4j..4j+3 of the 16
// rows (byte 4i + t: row i's input 4j + t):
//   Q8_0: the eight quad vectors, whole bytes;
//   the others: four nibble vectors, the low nibbles of vector v being quad
//     vector 2v's low four bits and its high nibbles quad vector 2v + 1's,
//     then, for 5- and 6-bit quants (Q5_0, Q5_K, Q5_1, Q6_K), one or two
//     planes of their top bits (the room the float panels' top-bit words
//     take).
// Biases: Q4_0 8 (its stored nibble), Q5_0 16, Q8_0 128, Q6_K 32, IQ4 128 (the nibble
// is a level index; a byte shuffle gives level + 128); the others 0. (AVX2's
// kernel takes Q8_0's and IQ4's off before its products instead: an XOR, and
// a shuffle to the level itself. The integer sums are the same.)
//
// Arithmetic (the determinism contract of backend.h). Per output element,
// with the activation block's scale a.d, its quants a.q and their sums:
//   acc = 0
//   for each block b:
//     for each run r of its inputs (one run of 32; Q6_K: two of 16):
//       i = sum over the run of stored(q) * a.q   (exact int32)
//           - bias * sum over the run of a.q      (exact)
//       acc = fma(D_b,r * a.d, float(i), acc)
//     with a minimum: acc = fma(M_b, a.ds, acc)
// (D = d, or d * scale; M = m for Q4_1, -(dmin * min) for the Block32 types
// that have one). Every kernel issues this sequence for every element, so a
// row's result does not depend on the batch, the tiling or the thread.
#ifndef TANDEM_ENGINE_KERNELS_CPU_PACKED_MATMUL_INT8_H_
#define TANDEM_ENGINE_KERNELS_CPU_PACKED_MATMUL_INT8_H_

#include <cstdint>
#include <memory>

#include "engine/kernels/backend.h"
#include "engine/kernels/cpu/matmul_q8.h"
#include "engine/kernels/cpu/packed_matmul.h"
#include "engine/kernels/cpu/two_digit_activations.h"

namespace tandem::kernels::cpu {

// Whether this build has integer dot products (AVX-512 VNNI or AVX2; then q8
// multiplies every packable weight by these kernels).
bool HasInt8Products();

// The integer panels of `weight`. REQUIRES: HasInt8Products() and
// CanPackWeight(weight's shape).
std::unique_ptr<PackedWeight> PackWeightInt8(const Weight& weight);

// Their bytes. REQUIRES: as PackWeightInt8.
int64_t PackedWeightBytesInt8(DType dtype, int64_t rows, int64_t cols);

// out[r][n] (+ bias[n]) for r < rows, n in [n0, n1) (multiples of 16), from
// QuantizeActivationRow's blocks (weight.cols / 32 per row).
void MatMulPackedInt8Rows(const PackedWeight& weight, const ActivationBlock* activations,
                          int64_t rows, int64_t n0, int64_t n1, const float* bias,
                          const Matrix& out);

// The q16 mode: the same panels times two-digit activations
// (two_digit_activations.h), where the build has AVX-512 VNNI. Per output
// element the arithmetic above with the run's integer
//   i = 256 * (sum of stored(q) * hi) + (sum of stored(q) * lo)
//       - bias * (sum of Q over the run)      (exact int32)
// and the block's d and ds the two-digit block's.
bool HasTwoDigitProducts();
void MatMulPackedTwoDigitRows(const PackedWeight& weight, const TwoDigitBlock* activations,
                              int64_t rows, int64_t n0, int64_t n1, const float* bias,
                              const Matrix& out);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_PACKED_MATMUL_INT8_H_
