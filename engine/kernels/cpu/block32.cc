#include "engine/kernels/cpu/block32.h"

#include <cstring>

namespace tandem::kernels::cpu {
namespace {

// Sub-block `sub` (0-7) of a Q4_K or Q5_K block: its 32 elements are the low
// (even sub) or high (odd sub) nibbles of qs[32 * (sub / 2) + l]; Q5_K's
// fifth bit of element l is bit `sub` of qh[l].
template <typename Block>
Block32 ReadKSubBlock(const Block& block, int sub) {
  Block32 out;
  out.d = block.d;
  out.dmin = block.dmin;
  uint8_t scale, min;
  Q4KScaleMin(sub, block.scales, &scale, &min);
  out.scale[0] = out.scale[1] = static_cast<int8_t>(scale);
  out.min = min;
  const uint8_t* qs = block.qs + 32 * (sub / 2);
  for (int l = 0; l < 32; ++l) {
    int q = (qs[l] >> (4 * (sub % 2))) & 0x0f;
    if constexpr (requires { block.qh; }) q |= ((block.qh[l] >> sub) & 1) << 4;
    out.q[l] = static_cast<int8_t>(q);
  }
  return out;
}

// Elements [32s, 32s + 32) of a Q6_K block: half h = s / 4 holds 128
// elements in ql[64h ..], qh[32h ..]; quarter t = s % 4 of it takes the low
// (t < 2) or high nibble of ql[64h + 32 (t % 2) + l] and bits 2t, 2t + 1 of
// qh[32h + l]; elements l < 16 and l >= 16 have scales 8h + 2t and 8h + 2t + 1.
Block32 ReadQ6KSubBlock(const BlockQ6_K& block, int s) {
  Block32 out;
  out.d = block.d;
  const int h = s / 4, t = s % 4;
  out.scale[0] = block.scales[8 * h + 2 * t];
  out.scale[1] = block.scales[8 * h + 2 * t + 1];
  const uint8_t* ql = block.ql + 64 * h + 32 * (t % 2);
  const uint8_t* qh = block.qh + 32 * h;
  for (int l = 0; l < 32; ++l) {
    const int low = t < 2 ? ql[l] & 0x0f : ql[l] >> 4;
    const int high = (qh[l] >> (2 * t)) & 3;
    out.q[l] = static_cast<int8_t>((low | high << 4) - 32);
  }
  return out;
}

// The 32 level indices of 16 IQ4 bytes: element j in the low nibble of
// qs[j], element j + 16 in its high one.
void Iq4Indices(const uint8_t* qs, int8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(qs[j] & 0x0f);
    q[j + 16] = static_cast<int8_t>(qs[j] >> 4);
  }
}

// Sub-block s of an IQ4_XS block: scale (its 6-bit scale - 32), the indices
// in qs[16s ..].
Block32 ReadIq4XsSubBlock(const BlockIQ4_XS& block, int s) {
  Block32 out;
  out.d = block.d;
  out.scale[0] = out.scale[1] = static_cast<int8_t>(Iq4XsScale(block, s));
  Iq4Indices(block.qs + 16 * s, out.q);
  return out;
}

Block32 ReadIq4NlBlock(const BlockIQ4_NL& block) {
  Block32 out;
  out.d = block.d;
  Iq4Indices(block.qs, out.q);
  return out;
}

// A Q5_1 block, w = d * q + m, as d * 1 * q - (-m) * 1: negating a half is
// exact, and so is each product.
Block32 ReadQ5_1Block(const BlockQ5_1& block) {
  Block32 out;
  out.d = block.d;
  out.dmin = static_cast<uint16_t>(block.m ^ 0x8000);
  out.min = 1;
  uint32_t qh;
  std::memcpy(&qh, block.qh, sizeof(qh));
  for (int j = 0; j < 16; ++j) {
    out.q[j] = static_cast<int8_t>((block.qs[j] & 0x0f) | (((qh >> j) & 1) << 4));
    out.q[j + 16] = static_cast<int8_t>((block.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
  return out;
}

template <typename Block>
const Block& At(const uint8_t* row, int64_t index) {
  return reinterpret_cast<const Block*>(row)[index];
}

}  // namespace

bool HasBlock32(DType type) {
  return type == DType::kQ4_K || type == DType::kQ5_K || type == DType::kQ6_K ||
         type == DType::kQ5_1 || type == DType::kIQ4_XS || type == DType::kIQ4_NL;
}

Block32 ReadBlock32(DType type, const uint8_t* row, int64_t b) {
  const int sub = static_cast<int>(b % 8);
  switch (type) {
    case DType::kQ4_K:
      return ReadKSubBlock(At<BlockQ4_K>(row, b / 8), sub);
    case DType::kQ5_K:
      return ReadKSubBlock(At<BlockQ5_K>(row, b / 8), sub);
    case DType::kQ6_K:
      return ReadQ6KSubBlock(At<BlockQ6_K>(row, b / 8), sub);
    case DType::kIQ4_XS:
      return ReadIq4XsSubBlock(At<BlockIQ4_XS>(row, b / 8), sub);
    case DType::kIQ4_NL:
      return ReadIq4NlBlock(At<BlockIQ4_NL>(row, b));
    default:
      return ReadQ5_1Block(At<BlockQ5_1>(row, b));
  }
}

}  // namespace tandem::kernels::cpu
