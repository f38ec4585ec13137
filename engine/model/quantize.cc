#include "engine/model/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/check.h"
#include "engine/kernels/half.h"
#include "engine/model/iq4_levels.h"

namespace tandem::model {
namespace {

using kernels::BlockIQ4_NL;
using kernels::BlockIQ4_XS;
using kernels::BlockQ4_K;
using kernels::BlockQ5_0;
using kernels::BlockQ5_1;
using kernels::BlockQ5_K;
using kernels::BlockQ6_K;
using kernels::BlockQ8_0;
using kernels::DType;
using kernels::FloatToHalf;
using kernels::HalfToFloat;

constexpr int kSuperBlock = 256;

// The element of largest magnitude, with its sign (the first of equals).
float SignedAbsMax(const float* x, int n) {
  float amax = 0.0f, value = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      value = x[i];
    }
  }
  return value;
}

// v rounded to the nearest integer (halves up) and clamped to [lo, hi].
int RoundClamped(float v, int lo, int hi) {
  return static_cast<int>(
      std::clamp(std::floor(v + 0.5f), static_cast<float>(lo), static_cast<float>(hi)));
}

void QuantizeQ8_0(const float* x, int64_t n_blocks, BlockQ8_0* out) {
  for (int64_t b = 0; b < n_blocks; ++b, x += 32) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = FloatToHalf(d);
    for (int i = 0; i < 32; ++i) out[b].qs[i] = static_cast<int8_t>(std::round(x[i] * id));
  }
}

// Element j's five bits: low nibble in qs[j % 16] (high half for j >= 16),
// fifth bit in bit j of qh.
void PackFiveBits(const uint8_t q[32], uint8_t qs[16], uint8_t qh_bytes[4]) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
    qh |= static_cast<uint32_t>(q[j] >> 4) << j;
    qh |= static_cast<uint32_t>(q[j + 16] >> 4) << (j + 16);
  }
  std::memcpy(qh_bytes, &qh, 4);
}

void QuantizeQ5_0(const float* x, int64_t n_blocks, BlockQ5_0* out) {
  for (int64_t b = 0; b < n_blocks; ++b, x += 32) {
    const float d = SignedAbsMax(x, 32) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[32];
    // Truncation of a value in [0.5, 32.5]: rounding to nearest, halves up.
    for (int i = 0; i < 32; ++i)
      q[i] = static_cast<uint8_t>(std::min(31, static_cast<int>(x[i] * id + 16.5f)));
    out[b].d = FloatToHalf(d);
    PackFiveBits(q, out[b].qs, out[b].qh);
  }
}

void QuantizeQ5_1(const float* x, int64_t n_blocks, BlockQ5_1* out) {
  for (int64_t b = 0; b < n_blocks; ++b, x += 32) {
    const auto [lo, hi] = std::minmax_element(x, x + 32);
    const float min = *lo, d = (*hi - *lo) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[32];
    for (int i = 0; i < 32; ++i)
      q[i] = static_cast<uint8_t>(std::min(31, static_cast<int>((x[i] - min) * id + 0.5f)));
    out[b].d = FloatToHalf(d);
    out[b].m = FloatToHalf(min);
    PackFiveBits(q, out[b].qs, out[b].qh);
  }
}

// Fits each of a super-block's 8 sub-blocks of 32 as x ~ scale * q -
// offset, q in [0, levels - 1], offset >= 0: tries roundings of the
// sub-block's range onto (levels - 1) +- 1 steps in tenths, fits scale and
// offset to each by least squares (the offset held at 0 where the fit wants
// a positive minimum) and keeps the least squared error. The loops run
// across the 8 sub-blocks, one per vector lane.
void FitScaleOffsets(const float* x, int levels, float scales[8], float offsets[8]) {
  constexpr int kSubs = 8, kLength = 32;
  const float top = static_cast<float>(levels - 1);
  float xt[kLength][kSubs];  // xt[i][j]: element i of sub-block j
  for (int j = 0; j < kSubs; ++j) {
    for (int i = 0; i < kLength; ++i) xt[i][j] = x[kLength * j + i];
  }
  float lo[kSubs], hi[kSubs], sx[kSubs], sxx[kSubs], best_error[kSubs];
  for (int j = 0; j < kSubs; ++j) {
    lo[j] = 0.0f;
    hi[j] = xt[0][j];
    sx[j] = sxx[j] = 0.0f;
  }
  for (int i = 0; i < kLength; ++i) {
    for (int j = 0; j < kSubs; ++j) {
      lo[j] = std::min(lo[j], xt[i][j]);
      hi[j] = std::max(hi[j], xt[i][j]);
      sx[j] += xt[i][j];
      sxx[j] += xt[i][j] * xt[i][j];
    }
  }
  float range[kSubs];
  for (int j = 0; j < kSubs; ++j) {
    const bool flat = hi[j] <= lo[j];
    range[j] = flat ? 1.0f : hi[j] - lo[j];
    scales[j] = flat ? 0.0f : range[j] / top;
    offsets[j] = -lo[j];
    best_error[j] = flat ? -1.0f : std::numeric_limits<float>::infinity();  // -1: keep
  }
  for (int step = -10; step <= 10; ++step) {
    float sq[kSubs] = {}, sqq[kSubs] = {}, sxq[kSubs] = {}, iscale[kSubs];
    for (int j = 0; j < kSubs; ++j) iscale[j] = (top + 0.1f * static_cast<float>(step)) / range[j];
    for (int i = 0; i < kLength; ++i) {
      for (int j = 0; j < kSubs; ++j) {
        const float q = std::min(top, std::floor(iscale[j] * (xt[i][j] - lo[j]) + 0.5f));
        sq[j] += q;
        sqq[j] += q * q;
        sxq[j] += xt[i][j] * q;
      }
    }
    for (int j = 0; j < kSubs; ++j) {
      const float det = kLength * sqq[j] - sq[j] * sq[j];
      float scale = (kLength * sxq[j] - sq[j] * sx[j]) / det;
      float bias = (sqq[j] * sx[j] - sq[j] * sxq[j]) / det;  // x ~ scale * q + bias
      const bool positive_min = bias > 0.0f;
      bias = positive_min ? 0.0f : bias;
      scale = positive_min ? sxq[j] / sqq[j] : scale;
      // The sum of (scale * q + bias - x)^2, expanded.
      const float error = scale * scale * sqq[j] + 2.0f * scale * bias * sq[j] +
                          kLength * bias * bias - 2.0f * scale * sxq[j] - 2.0f * bias * sx[j] +
                          sxx[j];
      const bool better = det > 0.0f && scale > 0.0f && error < best_error[j];
      best_error[j] = better ? error : best_error[j];
      scales[j] = better ? scale : scales[j];
      offsets[j] = better ? -bias : offsets[j];
    }
  }
}

// A K-quant super-block of 8 sub-blocks of 32 with six-bit scales and mins:
// writes d, dmin, the 12 packed scale bytes, and each element's integer
// (0 to levels - 1) rounded against the stored scales.
void QuantizeScaleMinSuperBlock(const float* x, int levels, uint16_t* d_out, uint16_t* dmin_out,
                                uint8_t scales[12], uint8_t q[kSuperBlock]) {
  float fit_scales[8], fit_offsets[8];
  FitScaleOffsets(x, levels, fit_scales, fit_offsets);
  float max_scale = 0.0f, max_offset = 0.0f;
  for (int j = 0; j < 8; ++j) {
    max_scale = std::max(max_scale, fit_scales[j]);
    max_offset = std::max(max_offset, fit_offsets[j]);
  }
  const float d = max_scale / 63.0f, dmin = max_offset / 63.0f;
  *d_out = FloatToHalf(d);
  *dmin_out = FloatToHalf(dmin);
  const float stored_d = HalfToFloat(*d_out), stored_dmin = HalfToFloat(*dmin_out);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0 ? RoundClamped(fit_scales[j] / d, 0, 63) : 0);
    m[j] = static_cast<uint8_t>(dmin > 0 ? RoundClamped(fit_offsets[j] / dmin, 0, 63) : 0);
  }
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
  }
  for (int j = 0; j < 8; ++j) {
    const float scale = stored_d * sc[j], offset = stored_dmin * m[j];
    for (int i = 0; i < 32; ++i) {
      q[32 * j + i] = static_cast<uint8_t>(
          scale > 0 ? RoundClamped((x[32 * j + i] + offset) / scale, 0, levels - 1) : 0);
    }
  }
}

// Sub-block pair s's elements l and l + 32 share byte qs[32 s + l] (low and
// high nibble).
void PackPairNibbles(const uint8_t q[kSuperBlock], uint8_t qs[128]) {
  for (int s = 0; s < 4; ++s) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * s + l] =
          static_cast<uint8_t>((q[64 * s + l] & 0x0f) | ((q[64 * s + 32 + l] & 0x0f) << 4));
    }
  }
}

void QuantizeQ4_K(const float* x, int64_t n_blocks, BlockQ4_K* out) {
  for (int64_t b = 0; b < n_blocks; ++b, x += kSuperBlock) {
    uint8_t q[kSuperBlock];
    QuantizeScaleMinSuperBlock(x, 16, &out[b].d, &out[b].dmin, out[b].scales, q);
    PackPairNibbles(q, out[b].qs);
  }
}

void QuantizeQ5_K(const float* x, int64_t n_blocks, BlockQ5_K* out) {
  for (int64_t b = 0; b < n_blocks; ++b, x += kSuperBlock) {
    uint8_t q[kSuperBlock];
    QuantizeScaleMinSuperBlock(x, 32, &out[b].d, &out[b].dmin, out[b].scales, q);
    PackPairNibbles(q, out[b].qs);
    std::memset(out[b].qh, 0, sizeof(out[b].qh));
    for (int s = 0; s < 4; ++s) {
      for (int l = 0; l < 32; ++l) {
        out[b].qh[l] |= static_cast<uint8_t>((q[64 * s + l] >> 4) << (2 * s));
        out[b].qh[l] |= static_cast<uint8_t>((q[64 * s + 32 + l] >> 4) << (2 * s + 1));
      }
    }
  }
}

// The scales of a Q6_K super-block's 16 sub-blocks of 16: x ~ scale * q, q
// in [-32, 31]. Candidates put the element of largest magnitude at -32 (+-
// 0.9 in tenths); each is refitted by least squares and the least squared
// error kept. The loops run across the 16 sub-blocks, one per vector lane.
void FitSymmetricScales(const float* x, float scales[16]) {
  constexpr int kSubs = 16, kLength = 16;
  float xt[kLength][kSubs];  // xt[i][j]: element i of sub-block j
  float max[kSubs], best_gain[kSubs];
  for (int j = 0; j < kSubs; ++j) {
    for (int i = 0; i < kLength; ++i) xt[i][j] = x[kLength * j + i];
    max[j] = SignedAbsMax(x + kLength * j, kLength);
    scales[j] = max[j] / -32.0f;
    best_gain[j] = 0.0f;
    if (max[j] == 0.0f) max[j] = 1.0f;  // every candidate gives q = 0
  }
  for (int step = -9; step <= 9; ++step) {
    float sxq[kSubs] = {}, sqq[kSubs] = {}, iscale[kSubs];
    for (int j = 0; j < kSubs; ++j) iscale[j] = -(32.0f + 0.1f * static_cast<float>(step)) / max[j];
    for (int i = 0; i < kLength; ++i) {
      for (int j = 0; j < kSubs; ++j) {
        const float q = std::clamp(std::floor(iscale[j] * xt[i][j] + 0.5f), -32.0f, 31.0f);
        sxq[j] += xt[i][j] * q;
        sqq[j] += q * q;
      }
    }
    // At the least-squares scale sxq / sqq the squared error is
    // sum(x^2) - sxq^2 / sqq: the larger that gain, the better.
    for (int j = 0; j < kSubs; ++j) {
      const float gain = sqq[j] > 0.0f ? sxq[j] * sxq[j] / sqq[j] : 0.0f;
      const bool better = gain > best_gain[j];
      best_gain[j] = better ? gain : best_gain[j];
      scales[j] = better ? sxq[j] / sqq[j] : scales[j];
    }
  }
}

void QuantizeQ6_K(const float* x, int64_t n_blocks, BlockQ6_K* out) {
  for (int64_t b = 0; b < n_blocks; ++b, x += kSuperBlock) {
    float scales[16];
    FitSymmetricScales(x, scales);
    const float max_scale = SignedAbsMax(scales, 16);
    const float d = max_scale / -128.0f;  // -0 for an all-zero block: decodes to zeros
    BlockQ6_K& block = out[b];
    block.d = FloatToHalf(d);
    const float stored_d = HalfToFloat(block.d);
    uint8_t stored[kSuperBlock];  // q + 32, 0..63
    for (int j = 0; j < 16; ++j) {
      block.scales[j] = static_cast<int8_t>(d != 0.0f ? RoundClamped(scales[j] / d, -128, 127) : 0);
      const float scale = stored_d * block.scales[j];
      for (int i = 0; i < 16; ++i) {
        const int q = scale != 0.0f ? RoundClamped(x[16 * j + i] / scale, -32, 31) : 0;
        stored[16 * j + i] = static_cast<uint8_t>(q + 32);
      }
    }
    // Each half of 128: elements l, l+32, l+64, l+96 put their low nibbles
    // in ql[l] and ql[l + 32] (low, high) and their top two bits in qh[l].
    for (int half = 0; half < 2; ++half) {
      const uint8_t* L = stored + 128 * half;
      uint8_t* ql = block.ql + 64 * half;
      uint8_t* qh = block.qh + 32 * half;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((L[l] & 0x0f) | ((L[l + 64] & 0x0f) << 4));
        ql[l + 32] = static_cast<uint8_t>((L[l + 32] & 0x0f) | ((L[l + 96] & 0x0f) << 4));
        qh[l] = static_cast<uint8_t>((L[l] >> 4) | ((L[l + 32] >> 4) << 2) |
                                     ((L[l + 64] >> 4) << 4) | ((L[l + 96] >> 4) << 6));
      }
    }
  }
}

// ggml's nearest_int: to nearest, halves to even (through the float
// adder), for |v| < 2^22.
int NearestInt(float v) {
  const float shifted = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  return (bits & 0x007fffff) - 0x00400000;
}

// IQ4_NL and IQ4_XS, as llama.cpp quantizes them without an importance
// matrix (quantize_row_iq4_nl_impl with seven tries each way): each block of
// 32 gets the scale, among the one through its largest element and the
// least-squares fits of 15 nearby ones, whose level choices fit the x^2-
// weighted elements best. For IQ4_XS (`blocks` = 8 of a super-block) the
// scales are then rounded to six bits of d = -(largest scale) / 32 and the
// levels chosen again against them. Writes d (`d` as a half), the six-bit
// scales (IQ4_XS), and the level indices L[0..32 * blocks).
struct Iq4Result {
  uint16_t d = 0;
  uint8_t scales[8] = {};  // stored six bits (scale + 32), IQ4_XS only
  uint8_t levels[kSuperBlock] = {};
};

Iq4Result QuantizeIq4(const float* x, int blocks) {
  constexpr int kTries = 7;
  const int8_t* values = kernels::kIq4NlLevels;
  Iq4Result r;
  float scales[8] = {};
  for (int ib = 0; ib < blocks; ++ib) {
    const float* xb = x + 32 * ib;
    uint8_t* lb = r.levels + 32 * ib;
    float weight[32];
    for (int j = 0; j < 32; ++j) weight[j] = xb[j] * xb[j];
    const float max = SignedAbsMax(xb, 32);
    if (std::fabs(max) < 1e-15f) continue;  // ggml's GROUP_MAX_EPS: scale 0
    // The levels of xb at 1 / `inverse` (into l), then the weighted sums of
    // level x value and level^2, in element order.
    float sumqx = 0.0f, sumq2 = 0.0f;
    auto fit = [&](float inverse, uint8_t* l) {
      NearestIq4Levels32(inverse, xb, l);
      sumqx = sumq2 = 0.0f;
      for (int j = 0; j < 32; ++j) {
        const float q = values[l[j]];
        const float w = weight[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
      }
    };
    float d = -max / values[0];
    fit(1 / d, lb);
    d = sumq2 > 0 ? sumqx / sumq2 : 0.0f;
    float best = d * sumqx;
    for (int itry = -kTries; itry <= kTries; ++itry) {
      uint8_t l[32];
      fit(static_cast<float>(itry + values[0]) / max, l);
      if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scales[ib] = d;
  }
  if (blocks == 1) {
    r.d = FloatToHalf(scales[0]);
    const float id = scales[0] != 0.0f ? 1 / scales[0] : 0.0f;
    NearestIq4Levels32(id, x, r.levels);
    return r;
  }
  const float d = -SignedAbsMax(scales, blocks) / 32;
  r.d = FloatToHalf(d);
  const float id = d != 0.0f ? 1 / d : 0.0f;
  for (int ib = 0; ib < blocks; ++ib) {
    const int l = std::clamp(NearestInt(id * scales[ib]), -32, 31);
    const float dl = d * static_cast<float>(l);
    const float idl = dl != 0.0f ? 1 / dl : 0.0f;
    NearestIq4Levels32(idl, x + 32 * ib, r.levels + 32 * ib);
    r.scales[ib] = static_cast<uint8_t>(l + 32);
  }
  return r;
}

// Element j of a 32-block in the low nibble of qs[j], j + 16 in the high one.
void PackIq4Nibbles(const uint8_t levels[32], uint8_t qs[16]) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(levels[j] | (levels[j + 16] << 4));
}

void QuantizeIQ4_NL(const float* x, int64_t n_blocks, BlockIQ4_NL* out) {
  for (int64_t b = 0; b < n_blocks; ++b, x += 32) {
    const Iq4Result r = QuantizeIq4(x, 1);
    out[b].d = r.d;
    PackIq4Nibbles(r.levels, out[b].qs);
  }
}

void QuantizeIQ4_XS(const float* x, int64_t n_blocks, BlockIQ4_XS* out) {
  for (int64_t b = 0; b < n_blocks; ++b, x += kSuperBlock) {
    const Iq4Result r = QuantizeIq4(x, 8);
    BlockIQ4_XS& block = out[b];
    block.d = r.d;
    block.scales_h = 0;
    std::memset(block.scales_l, 0, sizeof(block.scales_l));
    for (int ib = 0; ib < 8; ++ib) {
      block.scales_l[ib / 2] |= static_cast<uint8_t>((r.scales[ib] & 0x0f) << (4 * (ib % 2)));
      block.scales_h |= static_cast<uint16_t>((r.scales[ib] >> 4) << (2 * ib));
      PackIq4Nibbles(r.levels + 32 * ib, block.qs + 16 * ib);
    }
  }
}

}  // namespace

bool CanQuantize(DType type) {
  switch (type) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return true;
    default:
      return false;
  }
}

void QuantizeRow(DType type, const float* src, int64_t elements, void* dst) {
  TANDEM_CHECK(CanQuantize(type), "QuantizeRow: a type it does not write");
  TANDEM_CHECK(elements % kernels::Info(type).block_elements == 0,
               "QuantizeRow: a row that is not whole blocks");
  const int64_t n_blocks = elements / kernels::Info(type).block_elements;
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(elements) * sizeof(float));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < elements; ++i) static_cast<uint16_t*>(dst)[i] = FloatToHalf(src[i]);
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < elements; ++i) {
        static_cast<uint16_t*>(dst)[i] = kernels::FloatToBf16(src[i]);
      }
      return;
    case DType::kQ8_0:
      return QuantizeQ8_0(src, n_blocks, static_cast<BlockQ8_0*>(dst));
    case DType::kQ5_0:
      return QuantizeQ5_0(src, n_blocks, static_cast<BlockQ5_0*>(dst));
    case DType::kQ5_1:
      return QuantizeQ5_1(src, n_blocks, static_cast<BlockQ5_1*>(dst));
    case DType::kQ4_K:
      return QuantizeQ4_K(src, n_blocks, static_cast<BlockQ4_K*>(dst));
    case DType::kQ5_K:
      return QuantizeQ5_K(src, n_blocks, static_cast<BlockQ5_K*>(dst));
    case DType::kQ6_K:
      return QuantizeQ6_K(src, n_blocks, static_cast<BlockQ6_K*>(dst));
    case DType::kIQ4_NL:
      return QuantizeIQ4_NL(src, n_blocks, static_cast<BlockIQ4_NL*>(dst));
    case DType::kIQ4_XS:
      return QuantizeIQ4_XS(src, n_blocks, static_cast<BlockIQ4_XS*>(dst));
    default:
      break;
  }
}

}  // namespace tandem::model
