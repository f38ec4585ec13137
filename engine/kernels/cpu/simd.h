// Small SIMD helpers shared by the CPU kernels. Every helper has a fixed
// operation order, so a kernel built from them reduces each output element
// the same way whatever the batch (see backend.h, determinism contract).
#ifndef TANDEM_ENGINE_KERNELS_CPU_SIMD_H_
#define TANDEM_ENGINE_KERNELS_CPU_SIMD_H_

#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TANDEM_CPU_AVX2 1
#include <immintrin.h>
#if defined(__AVX512F__)
#define TANDEM_CPU_AVX512 1
#endif
#endif

#include "engine/kernels/half.h"

namespace tandem::kernels::cpu {

// exp(x) for float32 by range reduction to [-ln2/2, ln2/2] and a degree-6
// polynomial (relative error below 2e-7 on [-87, 88]); the scalar and vector
// forms compute bit-identical results.
inline float ExpApprox(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  if (x < -87.3f) return 0.0f;
  if (x > 88.7f) x = 88.7f;
  const float n = std::nearbyint(x * kLog2e);
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r;
  p = p + 1.0f;
  const int32_t e = static_cast<int32_t>(n) + 127;
  return p * Bits2Float(static_cast<uint32_t>(e) << 23);
}

#ifdef TANDEM_CPU_AVX2

inline __m256 Exp8(__m256 x) {
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 ln2_hi = _mm256_set1_ps(0.693359375f);
  const __m256 ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(88.7f));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, ln2_hi));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, ln2_lo));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(underflow, result);
}

// Sum of the 8 lanes in a fixed order: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
inline float HorizontalSum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The HorizontalSum of each of v[0..8), as the lanes of one vector: the
// same additions in the same association ((l0+l4)+(l2+l6)) + ((l1+l5)+
// (l3+l7)), eight at a time (so bitwise equal to summing each alone, with
// 15 shuffles and 7 additions where eight sums take 24 of each).
inline __m256 HorizontalSums8(const __m256* v) {
  __m256 halves[4];  // [v(2i) l0+l4 .. l3+l7 | v(2i+1) l0+l4 .. l3+l7]
  for (int i = 0; i < 4; ++i) {
    halves[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                              _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
  }
  // Per 128-bit lane, of keys (a, b): [a s0+s2, a s1+s3, b s0+s2, b s1+s3].
  const __m256 pairs0 = _mm256_add_ps(_mm256_shuffle_ps(halves[0], halves[1], 0x44),
                                      _mm256_shuffle_ps(halves[0], halves[1], 0xEE));
  const __m256 pairs1 = _mm256_add_ps(_mm256_shuffle_ps(halves[2], halves[3], 0x44),
                                      _mm256_shuffle_ps(halves[2], halves[3], 0xEE));
  // Sums of v0, v2, v4, v6 | v1, v3, v5, v7, then in key order.
  const __m256 sums = _mm256_add_ps(_mm256_shuffle_ps(pairs0, pairs1, 0x88),
                                    _mm256_shuffle_ps(pairs0, pairs1, 0xDD));
  return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

inline float HorizontalMax(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_max_ps(lo, hi);
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 LoadHalf8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

#endif  // TANDEM_CPU_AVX2

// Dot product of two float vectors of length n, in a fixed order.
inline float DotF32(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#ifdef TANDEM_CPU_AVX2
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  sum = HorizontalSum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_SIMD_H_
