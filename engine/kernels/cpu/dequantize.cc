#include "engine/kernels/cpu/dequantize.h"

#include <cstring>
#include <type_traits>

#include "engine/kernels/half.h"

namespace tandem::kernels::cpu {
namespace {

void DequantizeQ8_0(const BlockQ8_0* blocks, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float d = HalfToFloat(blocks[b].d);
    for (int j = 0; j < 32; ++j) dst[b * 32 + j] = d * blocks[b].qs[j];
  }
}

void DequantizeQ4_0(const BlockQ4_0* blocks, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float d = HalfToFloat(blocks[b].d);
    for (int j = 0; j < 16; ++j) {
      dst[b * 32 + j] = d * ((blocks[b].qs[j] & 0x0f) - 8);
      dst[b * 32 + j + 16] = d * ((blocks[b].qs[j] >> 4) - 8);
    }
  }
}

void DequantizeQ4_1(const BlockQ4_1* blocks, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float d = HalfToFloat(blocks[b].d);
    const float m = HalfToFloat(blocks[b].m);
    for (int j = 0; j < 16; ++j) {
      dst[b * 32 + j] = d * (blocks[b].qs[j] & 0x0f) + m;
      dst[b * 32 + j + 16] = d * (blocks[b].qs[j] >> 4) + m;
    }
  }
}

}  // namespace

void FiveBitValues(const uint8_t* qs, const uint8_t* qh_bytes, int out[32]) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof(qh));
  for (int j = 0; j < 16; ++j) {
    out[j] = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1) << 4);
    out[j + 16] = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
  }
}

namespace {

void DequantizeQ5_0(const BlockQ5_0* blocks, int64_t n_blocks, float* dst) {
  int q[32];
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float d = HalfToFloat(blocks[b].d);
    FiveBitValues(blocks[b].qs, blocks[b].qh, q);
    for (int j = 0; j < 32; ++j) dst[b * 32 + j] = d * (q[j] - 16);
  }
}

void DequantizeQ5_1(const BlockQ5_1* blocks, int64_t n_blocks, float* dst) {
  int q[32];
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float d = HalfToFloat(blocks[b].d);
    const float m = HalfToFloat(blocks[b].m);
    FiveBitValues(blocks[b].qs, blocks[b].qh, q);
    for (int j = 0; j < 32; ++j) dst[b * 32 + j] = d * q[j] + m;
  }
}

// 16 IQ4_NL elements of one scale from 16 bytes of indices: element j from
// the low nibble of qs[j], element j + 16 from its high one.
void DequantizeIq4Nibbles(float scale, const uint8_t* qs, float* y) {
  for (int j = 0; j < 16; ++j) {
    y[j] = scale * kIq4NlLevels[qs[j] & 0x0f];
    y[j + 16] = scale * kIq4NlLevels[qs[j] >> 4];
  }
}

void DequantizeIQ4_NL(const BlockIQ4_NL* blocks, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    DequantizeIq4Nibbles(HalfToFloat(blocks[b].d), blocks[b].qs, dst + b * 32);
  }
}

void DequantizeIQ4_XS(const BlockIQ4_XS* blocks, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockIQ4_XS& block = blocks[b];
    const float d = HalfToFloat(block.d);
    for (int sub = 0; sub < 8; ++sub) {
      DequantizeIq4Nibbles(d * static_cast<float>(Iq4XsScale(block, sub)), block.qs + 16 * sub,
                           dst + b * 256 + 32 * sub);
    }
  }
}

// Q4_K and Q5_K: eight sub-blocks of 32, each with its own scale and min
// (Q4KScaleMin), element l of sub-block pair s in the low (first 32) or high
// (next 32) nibble of qs[32s + l]. Q5_K adds a fifth bit: bit 2s of qh[l] for
// the low nibble's element, bit 2s + 1 for the high one's.
template <typename Block>
void DequantizeK(const Block* blocks, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const Block& block = blocks[b];
    const float d = HalfToFloat(block.d);
    const float dmin = HalfToFloat(block.dmin);
    const uint8_t* q = block.qs;
    float* y = dst + b * 256;
    for (int sub = 0; sub < 8; sub += 2) {
      uint8_t sc, m;
      Q4KScaleMin(sub, block.scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      Q4KScaleMin(sub + 1, block.scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) {
        int low = q[l] & 0x0f, high = q[l] >> 4;
        if constexpr (std::is_same_v<Block, BlockQ5_K>) {
          low += ((block.qh[l] >> sub) & 1) << 4;
          high += ((block.qh[l] >> (sub + 1)) & 1) << 4;
        }
        y[l] = d1 * low - m1;
        y[32 + l] = d2 * high - m2;
      }
      q += 32;
      y += 64;
    }
  }
}

void DequantizeQ6_K(const BlockQ6_K* blocks, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockQ6_K& block = blocks[b];
    const float d = HalfToFloat(block.d);
    const uint8_t* ql = block.ql;
    const uint8_t* qh = block.qh;
    const int8_t* sc = block.scales;
    float* y = dst + b * 256;
    for (int half = 0; half < 2; ++half) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

}  // namespace

bool WidensToQ8_0(DType type) { return type == DType::kQ5_0 || type == DType::kIQ4_NL; }

void WidenToQ8_0(DType type, const void* src, int64_t n_blocks, BlockQ8_0* dst) {
  if (type == DType::kIQ4_NL) {
    const auto* blocks = static_cast<const BlockIQ4_NL*>(src);
    for (int64_t b = 0; b < n_blocks; ++b) {
      dst[b].d = blocks[b].d;
      for (int j = 0; j < 16; ++j) {
        dst[b].qs[j] = kIq4NlLevels[blocks[b].qs[j] & 0x0f];
        dst[b].qs[j + 16] = kIq4NlLevels[blocks[b].qs[j] >> 4];
      }
    }
    return;
  }
  const auto* blocks = static_cast<const BlockQ5_0*>(src);
  int q[32];
  for (int64_t b = 0; b < n_blocks; ++b) {
    FiveBitValues(blocks[b].qs, blocks[b].qh, q);
    dst[b].d = blocks[b].d;
    for (int j = 0; j < 32; ++j) dst[b].qs[j] = static_cast<int8_t>(q[j] - 16);
  }
}

void DequantizeRow(DType type, const void* src, int64_t elements, float* dst) {
  const int64_t n_blocks = elements / Info(type).block_elements;
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(elements) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < elements; ++i) dst[i] = HalfToFloat(h[i]);
      return;
    }
    case DType::kBF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < elements; ++i) dst[i] = Bf16ToFloat(h[i]);
      return;
    }
    case DType::kQ8_0:
      return DequantizeQ8_0(static_cast<const BlockQ8_0*>(src), n_blocks, dst);
    case DType::kQ4_0:
      return DequantizeQ4_0(static_cast<const BlockQ4_0*>(src), n_blocks, dst);
    case DType::kQ4_1:
      return DequantizeQ4_1(static_cast<const BlockQ4_1*>(src), n_blocks, dst);
    case DType::kQ4_K:
      return DequantizeK(static_cast<const BlockQ4_K*>(src), n_blocks, dst);
    case DType::kQ6_K:
      return DequantizeQ6_K(static_cast<const BlockQ6_K*>(src), n_blocks, dst);
    case DType::kQ5_0:
      return DequantizeQ5_0(static_cast<const BlockQ5_0*>(src), n_blocks, dst);
    case DType::kQ5_1:
      return DequantizeQ5_1(static_cast<const BlockQ5_1*>(src), n_blocks, dst);
    case DType::kQ5_K:
      return DequantizeK(static_cast<const BlockQ5_K*>(src), n_blocks, dst);
    case DType::kIQ4_NL:
      return DequantizeIQ4_NL(static_cast<const BlockIQ4_NL*>(src), n_blocks, dst);
    case DType::kIQ4_XS:
      return DequantizeIQ4_XS(static_cast<const BlockIQ4_XS*>(src), n_blocks, dst);
  }
}

}  // namespace tandem::kernels::cpu
