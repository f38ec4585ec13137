#include "engine/kernels/cpu/two_digit_activations.h"

#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu/simd.h"

namespace tandem::kernels::cpu {

void QuantizeTwoDigitRow(const float* x, int64_t elements, TwoDigitBlock* out) {
  constexpr float kLimit = static_cast<float>(kTwoDigitLimit);
  for (int64_t b = 0; b < elements / 32; ++b) {
    const float* v = x + b * 32;
    TwoDigitBlock& block = out[b];
#ifdef TANDEM_CPU_AVX512
    // The scalar loop below, 16 lanes at a time: the maximum is exact in any
    // order (maxps returns its second operand, the running maximum, for a
    // NaN input), the rounding is nearbyint's (to nearest, ties to even),
    // the limits the same compares, and the sums integers.
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const __m512 in[2] = {_mm512_loadu_ps(v), _mm512_loadu_ps(v + 16)};
    __m512 lane_max = _mm512_setzero_ps();
    for (const __m512 lanes : in) lane_max = _mm512_max_ps(_mm512_andnot_ps(sign, lanes), lane_max);
    const float amax = _mm512_reduce_max_ps(lane_max);
    const float inverse = amax != 0.0f ? kLimit / amax : 0.0f;
    for (int h = 0; h < 2; ++h) {
      __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(in[h], _mm512_set1_ps(inverse)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), r);  // NaN -> 0
      r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-kLimit)), _mm512_set1_ps(kLimit));
      const __m512i q = _mm512_cvttps_epi32(r);
      const __m512i hi = _mm512_srai_epi32(_mm512_add_epi32(q, _mm512_set1_epi32(128)), 8);
      const __m512i lo = _mm512_sub_epi32(q, _mm512_slli_epi32(hi, 8));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(block.hi + 16 * h), _mm512_cvtepi32_epi8(hi));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(block.lo + 16 * h), _mm512_cvtepi32_epi8(lo));
      block.sums[h] = _mm512_reduce_add_epi32(q);
    }
#else
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float inverse = amax != 0.0f ? kLimit / amax : 0.0f;
    block.sums[0] = block.sums[1] = 0;
    for (int j = 0; j < 32; ++j) {
      float r = std::nearbyint(v[j] * inverse);
      if (std::isnan(r)) r = 0.0f;
      const int q = static_cast<int>(std::min(std::max(r, -kLimit), kLimit));
      const int hi = (q + 128) >> 8;
      block.hi[j] = static_cast<int8_t>(hi);
      block.lo[j] = static_cast<int8_t>(q - 256 * hi);
      block.sums[j / 16] += q;
    }
#endif
    block.d = amax / kLimit;
    block.ds = block.d * static_cast<float>(block.sums[0] + block.sums[1]);
  }
}

}  // namespace tandem::kernels::cpu
