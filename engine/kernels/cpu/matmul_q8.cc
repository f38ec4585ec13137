#include "engine/kernels/cpu/matmul_q8.h"

#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu/matmul_tiling.h"
#include "engine/kernels/cpu/simd.h"
#include "engine/kernels/half.h"

namespace tandem::kernels::cpu {
namespace {

inline float RoundThroughHalf(float x) { return HalfToFloat(FloatToHalf(x)); }

#ifndef TANDEM_CPU_AVX2  // (the vector code's own compares below)
// A rounded activation times 127 / amax, kept to -127..127 whatever the
// input: NaN (a NaN activation, or 0 times the infinite inverse of a block
// whose largest magnitude is below ~3.7e-37) becomes 0, and a product past
// the limits (an infinite activation) the limit. The integer kernels rely on
// it: AVX2's sign trick has no room for -128 (packed_matmul_int8_avx2.cc).
inline float QuantLimits(float r) {
  if (std::isnan(r)) return 0.0f;
  r = r > -127.0f ? r : -127.0f;
  return r < 127.0f ? r : 127.0f;
}
#endif

// A weight block as 32 signed integers, its scale and its offset (m for
// Q4_1; 0 for the symmetric formats, whose offset is folded into q).
struct UnpackedBlock {
#ifdef TANDEM_CPU_AVX2
  __m256i q;
#else
  int8_t q[32];
#endif
  float d;
  float m;
};

#ifdef TANDEM_CPU_AVX2

// 32 signed weight bytes times 32 signed activation bytes, pairwise summed
// into 8 int32 lanes (lane l covers elements 4l..4l+3). Exact.
inline __m256i DotI8(__m256i w, __m256i a) {
  const __m256i products = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
  return _mm256_madd_epi16(products, _mm256_set1_epi16(1));
}

// 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..15), then
// high nibbles (elements 16..31).
inline __m256i UnpackNibbles(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(packed, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
  return _mm256_set_m128i(hi, lo);
}

inline UnpackedBlock Unpack(const BlockQ8_0& b) {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)), HalfToFloat(b.d), 0.0f};
}
inline UnpackedBlock Unpack(const BlockQ4_0& b) {
  return {_mm256_sub_epi8(UnpackNibbles(b.qs), _mm256_set1_epi8(8)), HalfToFloat(b.d), 0.0f};
}
inline UnpackedBlock Unpack(const BlockQ4_1& b) {
  return {UnpackNibbles(b.qs), HalfToFloat(b.d), HalfToFloat(b.m)};
}

// Integer dot product per block, scaled and accumulated in 8 float lanes in
// block order; the offset term m * s accumulates separately.
template <int R, typename Block>
void DotTile(const Block* w, const ActivationBlock* const* act, int64_t blocks, float* out) {
  __m256 acc[R];
  float offsets[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    offsets[r] = 0.0f;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const UnpackedBlock u = Unpack(w[b]);
    for (int r = 0; r < R; ++r) {
      const ActivationBlock& a = act[r][b];
      const __m256i aq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q));
      const __m256 p = _mm256_cvtepi32_ps(DotI8(u.q, aq));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(u.d * a.d), p, acc[r]);
      offsets[r] += u.m * a.s;
    }
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]) + offsets[r];
}

#else  // portable: exact integer block sums, float accumulation in block order

inline void UnpackNibbles(const uint8_t* qs, int subtract, int8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>((qs[j] & 0x0f) - subtract);
    q[j + 16] = static_cast<int8_t>((qs[j] >> 4) - subtract);
  }
}

inline UnpackedBlock Unpack(const BlockQ8_0& b) {
  UnpackedBlock u{{}, HalfToFloat(b.d), 0.0f};
  for (int j = 0; j < 32; ++j) u.q[j] = b.qs[j];
  return u;
}
inline UnpackedBlock Unpack(const BlockQ4_0& b) {
  UnpackedBlock u{{}, HalfToFloat(b.d), 0.0f};
  UnpackNibbles(b.qs, 8, u.q);
  return u;
}
inline UnpackedBlock Unpack(const BlockQ4_1& b) {
  UnpackedBlock u{{}, HalfToFloat(b.d), HalfToFloat(b.m)};
  UnpackNibbles(b.qs, 0, u.q);
  return u;
}

template <int R, typename Block>
void DotTile(const Block* w, const ActivationBlock* const* act, int64_t blocks, float* out) {
  for (int r = 0; r < R; ++r) {
    float acc = 0.0f;
    float offsets = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      const UnpackedBlock u = Unpack(w[b]);
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) sum += u.q[j] * act[r][b].q[j];
      acc += u.d * act[r][b].d * static_cast<float>(sum);
      offsets += u.m * act[r][b].s;
    }
    out[r] = acc + offsets;
  }
}

#endif  // TANDEM_CPU_AVX2

template <typename Block>
void Rows(const Weight& weight, const ActivationBlock* activations, int64_t rows, int64_t n0,
          int64_t n1, const float* bias, const Matrix& out) {
  const int64_t blocks = weight.cols / 32;
  const auto* base = static_cast<const Block*>(weight.data);
  ForEachTile(rows, n0, n1, bias, out, [&]<int R>(int64_t first_row, int64_t n, float* dots) {
    const ActivationBlock* act[R];
    for (int r = 0; r < R; ++r) act[r] = activations + (first_row + r) * blocks;
    DotTile<R>(base + n * blocks, act, blocks, dots);
  });
}

}  // namespace

bool HasQ8Kernel(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kQ4_0 || dtype == DType::kQ4_1;
}

void MatMulQ8Rows(const Weight& weight, const ActivationBlock* activations, int64_t rows,
                  int64_t n0, int64_t n1, const float* bias, const Matrix& out) {
  switch (weight.dtype) {
    case DType::kQ8_0:
      return Rows<BlockQ8_0>(weight, activations, rows, n0, n1, bias, out);
    case DType::kQ4_0:
      return Rows<BlockQ4_0>(weight, activations, rows, n0, n1, bias, out);
    case DType::kQ4_1:
      return Rows<BlockQ4_1>(weight, activations, rows, n0, n1, bias, out);
    default:
      return;
  }
}

void QuantizeActivationRow(const float* x, int64_t elements, ActivationBlock* out) {
  for (int64_t b = 0; b < elements / 32; ++b) {
    const float* v = x + b * 32;
    int32_t halves[2] = {0, 0};
#ifdef TANDEM_CPU_AVX2
    // The scalar loop below, 8 lanes at a time: the maximum is exact in any
    // order (a NaN is skipped, as std::max skips it), the rounding is
    // nearbyint's (to nearest, ties to even), the limits the same compares
    // (maxps and minps return their second operand for a NaN, which is 0
    // by then) and the sums are integers.
    __m256 in[4];
    __m256 lane_max = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < 4; ++i) {
      in[i] = _mm256_loadu_ps(v + 8 * i);
      lane_max = _mm256_max_ps(_mm256_andnot_ps(sign, in[i]), lane_max);
    }
    const float amax = HorizontalMax(lane_max);
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      __m256 r = _mm256_round_ps(_mm256_mul_ps(in[i], _mm256_set1_ps(inverse)),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q));  // NaN -> 0
      r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
      q[i] = _mm256_cvttps_epi32(r);
    }
    // int32 -> int8 (values -127..127), the lanes back in input order.
    const __m256i words =
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(out[b].q),
        _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    for (int h = 0; h < 2; ++h) {
      const __m256i sum = _mm256_add_epi32(q[2 * h], q[2 * h + 1]);
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      halves[h] = _mm_cvtsi128_si32(s4);
    }
#else
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(QuantLimits(std::nearbyint(v[j] * inverse)));
      out[b].q[j] = static_cast<int8_t>(q);
      halves[j / 16] += q;
    }
#endif
    const float d = amax / 127.0f;
    const int32_t sum = halves[0] + halves[1];
    out[b].d = RoundThroughHalf(d);
    out[b].s = RoundThroughHalf(d * static_cast<float>(sum));
    out[b].ds = out[b].d * static_cast<float>(sum);
    out[b].sums[0] = static_cast<int16_t>(halves[0]);
    out[b].sums[1] = static_cast<int16_t>(halves[1]);
  }
}

}  // namespace tandem::kernels::cpu
