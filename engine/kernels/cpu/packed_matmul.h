// Quantized weights re-laid out for the float32 matrix product, and the
// kernels that multiply by them (AVX-512 and AVX2 builds: packed_panels.cc
// packs, packed_matmul.cc multiplies with AVX-512, packed_matmul_avx2.cc
// with AVX2).
//
// Why: GGUF keeps each output row's 32-input blocks together, so a vector
// holds 32 inputs of one row, each output ends in a horizontal sum, and a
// tile of activation rows shares only the decoding of one block. The packed
// layout groups 16 output rows into a panel and, for each 32-input block,
// stores the 16 rows' scales and then their quants input by input: one
// vector load yields one input's weights for all 16 rows. A vector lane is
// an output feature, the activation is a broadcast scalar, and the product
// is a register-tiled GEMM (BLIS-style) with no horizontal sums.
//
// Arithmetic (the determinism contract of backend.h): every output element
// is one chain of fused multiply-adds over its inputs in order,
//   acc = 0; for k in 0..K: acc = fma(x[k], w[k], acc); out = acc (+ bias)
// where w[k] is the weight exactly as DequantizeRow gives it. Both kernels
// (decoding on the fly for a few rows, dequantizing a panel once for many)
// issue that chain for each element, so a row's result is bitwise the same
// whatever the number of rows, the tiling or the thread.
#ifndef TANDEM_ENGINE_KERNELS_CPU_PACKED_MATMUL_H_
#define TANDEM_ENGINE_KERNELS_CPU_PACKED_MATMUL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/kernels/backend.h"

namespace tandem::kernels::cpu {

// Output rows per panel (one AVX-512 vector of floats, two AVX2 ones).
inline constexpr int64_t kPanelWidth = 16;

// A weight in the packed layout. Panel p covers output rows
// [16p, 16p + 16) and occupies bytes [p * panel_bytes, (p + 1) * panel_bytes)
// of `data`: its 32-input blocks in input order, each holding the 16 rows'
// scales and then their quants. Where the file's blocks share a scale over
// 256 inputs (Q4_K, Q5_K, Q6_K), a header holding the 16 rows' shared scales
// comes before each run of 8 blocks. Quants are nibbles, five or six bits, or
// bytes:
//   nibbles:   4 groups of 64 bytes, group g holding inputs [8g, 8g + 8):
//              its 16-bit word 2i + h holds row i's quants of inputs
//              8g + 2k + h (k = 0..3) at bits 4k..4k+3 (NibbleAt). So the
//              group's 32-bit lane i, shifted right by 4k and masked with
//              0x000f000f, is row i's quants of inputs 2j and 2j + 1 (pair
//              j = 4g + k) as two 16-bit integers, in the order of the
//              bfloat16 pair products: one load serves four pairs, and a
//              pair costs a shift and a mask.
//   five bits: the nibbles of the quants' low four bits, then 16 words of
//              their fifth bits: word j (little-endian) has row i's fifth bit
//              of input 2j at bit 2i and of input 2j + 1 at bit 2i + 1, a
//              mask over the 16-bit halves of a bfloat16 pair vector (so a
//              5-bit weight takes about the room it takes in the file).
//   six bits:  five bits, then 16 words of the sixth bits in the same order.
//   bytes:     32 groups of 16 bytes; byte i of group j is row i's quant of
//              input j.
// The layouts below give each format's offsets.
struct PackedWeight {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t panel_bytes = 0;  // PanelBytes<its layout>(cols)
  std::unique_ptr<uint8_t[], void (*)(void*)> data{nullptr, nullptr};
};

// Where the nibbles keep row i's quant of input e of a block (its low four
// bits): the byte, and the shift of the nibble in it.
struct NibblePlace {
  int64_t byte;
  int shift;
};
constexpr NibblePlace NibbleAt(int e, int i) {
  const int group = e / 8, k = e % 8 / 2, half = e % 2;
  return {64 * group + 4 * i + 2 * half + k / 2, 4 * (k % 2)};
}

// A layout: kBlocksPerHeader blocks of kBlockBytes after each header of
// kHeaderBytes (1 and 0 where every block holds its own scales).
template <typename L>
constexpr int64_t GroupBytes() {
  return L::kHeaderBytes + L::kBlocksPerHeader * L::kBlockBytes;
}
template <typename L>
constexpr int64_t PanelBytes(int64_t cols) {
  return cols / 32 / L::kBlocksPerHeader * GroupBytes<L>();
}
// Where block b's header and the block itself start in a panel.
template <typename L>
constexpr int64_t HeaderOffset(int64_t b) {
  return b / L::kBlocksPerHeader * GroupBytes<L>();
}
template <typename L>
constexpr int64_t BlockOffset(int64_t b) {
  return HeaderOffset<L>(b) + L::kHeaderBytes + b % L::kBlocksPerHeader * L::kBlockBytes;
}

// Q4_0 (d halves, nibbles), Q4_1 (d halves, m halves, nibbles), Q8_0 (d
// halves, bytes): the scales at the block's start.
template <int64_t kBytes>
struct PlainLayout {
  static constexpr int64_t kBlocksPerHeader = 1, kHeaderBytes = 0, kBlockBytes = kBytes;
};
using Q4_1Layout = PlainLayout<32 + 32 + 256>;
using Q4_0Layout = PlainLayout<32 + 256>;
using Q8_0Layout = PlainLayout<32 + 512>;
// Five-bit quants: the nibbles, then at this offset from them the fifth bits.
inline constexpr int64_t kFifthBitsOffset = 256;
inline constexpr int64_t kFiveBitBytes = kFifthBitsOffset + 64;
inline constexpr int64_t kSixthBitsOffset = kFiveBitBytes;
inline constexpr int64_t kSixBitBytes = kSixthBitsOffset + 64;
// Q5_0: d halves, five-bit quants (the stored integers q, w = d * (q - 16)).
struct Q5_0Layout {
  static constexpr int64_t kBlocksPerHeader = 1, kHeaderBytes = 0, kD = 0, kQuants = 32;
  static constexpr int64_t kBlockBytes = kQuants + kFiveBitBytes;
};
// The Block32 types (block32.h). Offsets of header fields count from the
// header, of block fields from the block (the same place without a header).
struct Q4KLayout {  // header: d, dmin halves; block: scale, min bytes, nibbles
  static constexpr int64_t kBlocksPerHeader = 8, kHeaderBytes = 64, kD = 0, kDmin = 32;
  static constexpr int64_t kScale = 0, kMin = 16, kQuants = 32, kBlockBytes = kQuants + 256;
};
struct Q5KLayout {  // header: d, dmin halves; block: scale, min bytes, five bits
  static constexpr int64_t kBlocksPerHeader = 8, kHeaderBytes = 64, kD = 0, kDmin = 32;
  static constexpr int64_t kScale = 0, kMin = 16, kQuants = 32;
  static constexpr int64_t kBlockBytes = kQuants + kFiveBitBytes;
};
struct ScaledMinLayout {  // Q5_1: d, dmin halves, scale, min bytes, five bits
  static constexpr int64_t kBlocksPerHeader = 1, kHeaderBytes = 0, kD = 0, kDmin = 32;
  static constexpr int64_t kScale = 64, kMin = 80, kQuants = 96;
  static constexpr int64_t kBlockBytes = kQuants + kFiveBitBytes;
};
// Q6_K: header: d halves; block: scale bytes of inputs 0-15 and 16-31, then
// six-bit quants: each quant + 32 (0-63), as the file stores it.
struct Q6KLayout {
  static constexpr int64_t kBlocksPerHeader = 8, kHeaderBytes = 32, kD = 0;
  static constexpr int64_t kScale0 = 0, kScale1 = 16, kQuants = 32;
  static constexpr int64_t kBlockBytes = kQuants + kSixBitBytes;
};
struct LevelsLayout {  // IQ4_NL, IQ4_XS: d halves, scale bytes, level index nibbles
  static constexpr int64_t kBlocksPerHeader = 1, kHeaderBytes = 0, kD = 0;
  static constexpr int64_t kScale = 32, kQuants = 48, kBlockBytes = kQuants + 256;
};
// F16 and BF16: no scales, the 16 rows' 16-bit values. F16: 32 groups of
// 32 bytes, group j the rows' halves of input j (one load, one conversion
// to float). BF16: 16 groups of 64 bytes, 32-bit word i of group j row i's
// inputs 2j (low half) and 2j + 1 (high): the order of the bfloat16 pair
// products, so the bf16 mode multiplies them as they are stored.
using HalfLayout = PlainLayout<1024>;

// Whether a packed weight of this type is multiplied by the bfloat16
// products in the bf16 mode: every packable type but F16 (whose 11-bit
// significands bfloat16 cannot hold; it is multiplied by its float32 panels
// in every mode).
bool HasBf16Panels(DType dtype);
// Whether it can have integer panels in the q8 mode: the quantized types,
// not F16 or BF16 (their values are no integers; float32 panels there).
bool HasInt8Panels(DType dtype);

// Whether this build packs weights of this type and shape (AVX2 or AVX-512; Q4_0,
// Q4_1, Q5_0, Q8_0, a Block32 type, F16 or BF16; rows a multiple of 16, cols
// of 32).
bool CanPackWeight(DType dtype, int64_t rows, int64_t cols);

// The bytes of PackWeight's copy. REQUIRES: CanPackWeight(dtype, rows, cols).
int64_t PackedWeightBytes(DType dtype, int64_t rows, int64_t cols);

// The packed copy of `weight`. REQUIRES: CanPackWeight(weight's shape).
std::unique_ptr<PackedWeight> PackWeight(const Weight& weight);

// Zeroed panels of `panel_bytes` each for `weight`'s type and shape
// (64-byte aligned), for a packer to fill. REQUIRES: CanPackWeight(...).
std::unique_ptr<PackedWeight> AllocatePanels(const Weight& weight, int64_t panel_bytes);

// out[r][n] (+ bias[n]) for every row r of x and the weight rows [n0, n1),
// both multiples of 16. `scratch` holds dequantized panels when x has enough
// rows to reuse them (grown as needed; one per thread).
void MatMulPackedRows(const PackedWeight& weight, const Matrix& x, int64_t n0, int64_t n1,
                      const float* bias, std::vector<float>& scratch, const Matrix& out);

// --- bfloat16 activations (MatMulMode::kBf16) --------------------------------
//
// The same packed weights, with each activation rounded to bfloat16 and the
// products summed in float32 by AVX-512 BF16 dot products (two products per
// lane per instruction: twice the float32 FMA rate on AMD Zen 4). The quants
// are small integers, exact in bfloat16, so only the activations are
// rounded. Per output element:
//   acc = 0
//   for each block b:
//     for each run r of its inputs (one run of 32; Q6_K: two of 16):
//       inner = 0
//       for each pair j of the run: inner = dot(inner, x~[2j], x~[2j+1],
//                                               v[2j], v[2j+1])
//       acc = fma(D_b,r, inner, acc)
//     with a minimum: acc = fma(M_b, sum of x~ over the block, acc)
// (v = bfloat16(128 + q) for the formats of nibbles and five bits: Q4_0,
// Q4_1, Q5_0, Q4_K, Q5_K, Q5_1: a shift and one vpternlogd from the nibbles,
// plus a masked add for a fifth bit (packed_matmul_bf16.cc);
// Q6_K's quant (its stored six bits less 32), the level of IQ4_NL and IQ4_XS, the
// byte for Q8_0, the weight itself for BF16; D = d, or d * scale, or 1 for
// BF16; M = the coefficient that makes w = D * v + M right: m - 128 d for
// Q4_1, -136 d for Q4_0, -144 d for Q5_0, -(dmin * min) - 128 D for the
// Block32 types with a minimum, none for the others), the same in both
// kernels, so rows stay batch invariant. The bias costs accuracy: the inner
// sums grow ~17-30x, so float32 keeps ~2^-15 of a block's result (its worst
// case, most quants at the zero point), far below the rounding of the
// activations to bfloat16 (2^-9). F16 weights are not
// multiplied here (HasBf16Panels).

// Whether this build has the AVX-512 BF16 instructions.
bool HasBf16Products();

// xb = x rounded to bfloat16 (nearest even); sums[b] = the sum of block b of
// the rounded values, in order. cols % 32 == 0.
void RoundActivationsToBf16(const float* x, int64_t cols, uint16_t* xb, float* sums);

// out[r][n] (+ bias[n]) for r < rows, n in [n0, n1) (multiples of 16), from
// RoundActivationsToBf16's rows (cols / 32 sums per row).
void MatMulPackedBf16Rows(const PackedWeight& weight, const uint16_t* xb, const float* sums,
                          int64_t rows, int64_t n0, int64_t n1, const float* bias,
                          std::vector<float>& scratch, const Matrix& out);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_PACKED_MATMUL_H_
