// Element types of weight tensors, and the block layouts of the quantized ones.
//
// Quantized types store a row as a sequence of fixed-size blocks; a row's
// length must be a multiple of the block's element count. The layouts are the
// GGUF/ggml ones, so that weights are used straight from the memory-mapped file.
#ifndef TANDEM_ENGINE_KERNELS_DTYPE_H_
#define TANDEM_ENGINE_KERNELS_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tandem::kernels {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ4_K,
  kQ6_K,
  kQ5_0,
  kQ5_1,
  kQ5_K,
  kIQ4_NL,
  kIQ4_XS,
};

struct DTypeInfo {
  std::string_view name;
  int block_elements;  // elements per block (1 for plain floats)
  int block_bytes;     // bytes per block
};

const DTypeInfo& Info(DType type);

// Bytes taken by `elements` elements; REQUIRES: elements % block_elements == 0.
inline size_t RowBytes(DType type, int64_t elements) {
  const DTypeInfo& info = Info(type);
  return static_cast<size_t>(elements / info.block_elements) * info.block_bytes;
}

// Block layouts (little-endian, packed, as in GGUF files). Scales are IEEE
// half floats stored as raw bits.
struct BlockQ8_0 {
  static constexpr int kElements = 32;
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ4_0 {
  static constexpr int kElements = 32;
  uint16_t d;
  uint8_t qs[16];  // element j in the low nibble of qs[j], j+16 in the high one
};
struct BlockQ4_1 {
  static constexpr int kElements = 32;
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct BlockQ4_K {
  static constexpr int kElements = 256;
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // 8 six-bit scales and 8 six-bit mins, packed
  uint8_t qs[128];
};
struct BlockQ6_K {
  static constexpr int kElements = 256;
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
// Sub-block j's (0-7) 6-bit scale and min of a Q4_K or Q5_K block from its 12
// scale bytes: sub-blocks 0-3 in the low 6 bits of bytes 0-7, sub-blocks 4-7
// split between the nibbles of bytes 8-11 and the top 2 bits of bytes 0-7.
inline void Q4KScaleMin(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}
// Five-bit types: the low four bits of each element as in Q4_0 / Q4_1 /
// Q4_K, the fifth in a separate bit field.
struct BlockQ5_0 {
  static constexpr int kElements = 32;
  uint16_t d;
  uint8_t qh[4];   // bit j (little-endian uint32): element j's fifth bit
  uint8_t qs[16];  // element j in the low nibble of qs[j], j+16 in the high one
};
struct BlockQ5_1 {
  static constexpr int kElements = 32;
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_K {
  static constexpr int kElements = 256;
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // packed as Q4_K's
  uint8_t qh[32];      // bit 2s (2s + 1) of qh[l]: the fifth bit of element l (l + 32) of pair s
  uint8_t qs[128];
};
// Non-linear four-bit types: each 4-bit index selects one of 16 fixed
// levels (kIq4NlLevels), times the block's scale.
inline constexpr int8_t kIq4NlLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
struct BlockIQ4_NL {
  static constexpr int kElements = 32;
  uint16_t d;
  uint8_t qs[16];  // element j in the low nibble of qs[j], j+16 in the high one
};
struct BlockIQ4_XS {
  static constexpr int kElements = 256;
  uint16_t d;
  // Sub-block i's 6-bit scale (stored + 32): low four bits in nibble i % 2
  // of scales_l[i / 2], high two bits in bits 2i, 2i + 1 of scales_h.
  uint16_t scales_h;
  uint8_t scales_l[4];
  uint8_t qs[128];  // sub-block i: qs[16i .. 16i + 15], laid out as IQ4_NL's
};
// Sub-block i's (0-7) scale of an IQ4_XS block, its stored 6 bits - 32.
inline int Iq4XsScale(const BlockIQ4_XS& block, int i) {
  return (((block.scales_l[i / 2] >> (4 * (i % 2))) & 0x0f) |
          (((block.scales_h >> (2 * i)) & 3) << 4)) -
         32;
}
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);

}  // namespace tandem::kernels

#endif  // TANDEM_ENGINE_KERNELS_DTYPE_H_
