// The vector kernels of attention over a bfloat16 KV cache (the bf16
// --cpu_matmul mode, where WriteKv stores K and V as bfloat16): query-key
// scores and probability-weighted value sums as AVX-512 BF16 dot products
// (vdpbf16ps: pairs of bfloat16 products summed into float32 lanes), which
// do in one instruction what float32 needs two to four for, with no
// conversion of the cache. Included by attention.cc only.
//
// Every query's arithmetic is fixed by its own inputs alone:
// - a score is q . k over kDim / 32 chained dot-product instructions into
//   eight float32 lanes (two chains, added), then the lanes summed by one
//   fixed tree
//   (HorizontalSums8 / HorizontalSum), whether its key is one of eight
//   scored together or the last of a block;
// - a value sum takes keys in pairs at even positions (2i, 2i + 1),
//   probabilities rounded to bfloat16, in position order; a pair whose
//   second key the query does not see has probability 0 there (0 x a finite
//   value adds nothing), and a pair past the task's last key takes a zero
//   row.
// So a query gets the same bits alone, among a verification's rows or in a
// prompt chunk, as the float32 kernels guarantee for their mode.
#ifndef TANDEM_ENGINE_KERNELS_CPU_ATTENTION_BF16_H_
#define TANDEM_ENGINE_KERNELS_CPU_ATTENTION_BF16_H_

#include <cstdint>
#include <cstring>
#include <limits>

#include "engine/kernels/cpu/simd.h"

#if defined(TANDEM_CPU_AVX512) && defined(__AVX512BF16__)
#define TANDEM_CPU_BF16_ATTENTION 1
#endif

// GCC 12 reports the undefined pass-through operand inside AVX-512
// intrinsics (_mm512_undefined_ps) as maybe-uninitialized once they are
// inlined (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tandem::kernels::cpu::bf16_attention {

// Whether this build has the kernels for heads of `head_dim` (the sizes the
// float32 vector kernels have). Where it does not, the cache stays in halves.
inline bool Supported(int head_dim) {
#ifdef TANDEM_CPU_BF16_ATTENTION
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
#else
  (void)head_dim;
  return false;
#endif
}

// A zero row for the missing partner of a task's last key (at least as
// long as the largest supported head).
inline constexpr uint16_t kZeroRow[256] = {};

#ifdef TANDEM_CPU_BF16_ATTENTION

inline __m512bh AsBf16(__m512i x) { return reinterpret_cast<__m512bh&>(x); }
inline __m256bh AsBf16(__m256i x) { return reinterpret_cast<__m256bh&>(x); }
inline __m512i LoadWords(const void* p) { return _mm512_loadu_si512(p); }
inline __m256i LoadWords8(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// q rounded to bfloat16 (to nearest even), in order: out[0..kDim).
template <int kDim>
inline void QueryToBf16(const float* q, uint16_t* out) {
  for (int c = 0; c < kDim / 32; ++c) {
    const __m512bh pair =
        _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + 32 * c + 16), _mm512_loadu_ps(q + 32 * c));
    _mm512_storeu_si512(out + 32 * c, reinterpret_cast<const __m512i&>(pair));
  }
}

// exp(x) for x <= 0 (scores less their maximum), to about 3e-6 relative:
// the probabilities are rounded to bfloat16 (3.9e-3) before they are used,
// and only their float32 sum keeps more. Range reduction x = n ln2 + r with
// |r| <= ln2 / 2, a degree-5 Taylor polynomial in r, and 2^n by scalef;
// below -87.3 (and for -inf) 0, as the float32 kernels' exp.
inline __m512 Exp16(__m512 x) {
  const __mmask16 above_underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 120);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(above_underflow, _mm512_scalef_ps(p, n));
}

// The softmax numerators of scores[0..n) (n >= 1): out[j] = bfloat16(
// exp(scores[j] - max)). Returns the float32 sum of the
// exponentials. Every element goes through the same instructions, the last
// ones masked, and the sum through 16 lanes then one fixed reduction.
inline float ExpToBf16(const float* scores, int64_t n, uint16_t* out) {
  auto mask = [n](int64_t j) {
    return n - j >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (n - j)) - 1);
  };
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < n; j += 16) {
    vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, mask(j), scores + j));
  }
  const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 valid = mask(j);
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(valid, scores + j), max));
    sum = _mm512_mask_add_ps(sum, valid, sum, e);
    const __m256bh b = _mm512_cvtneps_pbh(e);
    _mm256_mask_storeu_epi16(out + j, valid, reinterpret_cast<const __m256i&>(b));
  }
  return _mm512_reduce_add_ps(sum);
}

// The eight lanes whose HorizontalSum is q . k: two chains of kDim / 32
// dot-product instructions of eight lanes (over the even and the odd
// 16-element chunks), added lane by lane. (Eight lanes rather than 16: on
// CPUs that split 512-bit operations in two, such as AMD Zen 4, summing
// 16-lane vectors across their lanes costs more than the products.)
template <int kDim>
inline __m256 DotLanes(const __m256bh* q, const uint16_t* k) {
  __m256 acc0 = _mm256_dpbf16_ps(_mm256_setzero_ps(), q[0], AsBf16(LoadWords8(k)));
  __m256 acc1 = _mm256_dpbf16_ps(_mm256_setzero_ps(), q[1], AsBf16(LoadWords8(k + 16)));
  for (int c = 2; c < kDim / 16; c += 2) {
    acc0 = _mm256_dpbf16_ps(acc0, q[c], AsBf16(LoadWords8(k + 16 * c)));
    acc1 = _mm256_dpbf16_ps(acc1, q[c + 1], AsBf16(LoadWords8(k + 16 * c + 16)));
  }
  return _mm256_add_ps(acc0, acc1);
}

// scores[b][j] = scale * (q[b] . rows[j]) for j in [0, n) and NQ queries
// that share each key's loads; q and the rows bfloat16. HorizontalSums8
// adds eight keys' lanes as HorizontalSum adds one key's, so a score does
// not depend on where its key falls or which queries it is computed with.
template <int NQ, int kDim>
void ScoreRows(const uint16_t* const* q, const uint16_t* const* rows, int n, float scale,
               float* const* scores) {
  __m256bh qv[NQ][kDim / 16];
  for (int b = 0; b < NQ; ++b) {
    for (int c = 0; c < kDim / 16; ++c) qv[b][c] = AsBf16(LoadWords8(q[b] + 16 * c));
  }
  const __m256 vscale = _mm256_set1_ps(scale);
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 lanes[NQ][8];
    for (int i = 0; i < 8; ++i) {
      for (int b = 0; b < NQ; ++b) lanes[b][i] = DotLanes<kDim>(qv[b], rows[j + i]);
    }
    for (int b = 0; b < NQ; ++b) {
      _mm256_storeu_ps(scores[b] + j, _mm256_mul_ps(HorizontalSums8(lanes[b]), vscale));
    }
  }
  for (; j < n; ++j) {
    for (int b = 0; b < NQ; ++b) {
      scores[b][j] = HorizontalSum(DotLanes<kDim>(qv[b], rows[j])) * scale;
    }
  }
}

// acc[b] += sum over pairs i < pairs of (p[b][2i], p[b][2i + 1]) .
// (rows[2i], rows[2i + 1]), in order of i, for NQ queries: bfloat16
// probabilities and value rows. The
// accumulators are in the interleaved order of Interleaved (see
// UninterleaveDims): each 32 dimensions as [0-3, 8-11, 16-19, 24-27] then
// [4-7, 12-15, 20-23, 28-31].
template <int NQ, int kDim>
void AccumulatePairs(float* const* acc, const uint16_t* const* p, const uint16_t* const* rows,
                     int pairs) {
  __m512 a[NQ][kDim / 16];
  for (int b = 0; b < NQ; ++b) {
    for (int c = 0; c < kDim / 16; ++c) a[b][c] = _mm512_loadu_ps(acc[b] + 16 * c);
  }
  for (int i = 0; i < pairs; ++i) {
    const uint16_t* first = rows[2 * i];
    const uint16_t* second = rows[2 * i + 1];
    __m512bh v[kDim / 16];  // (first[d], second[d]) words, interleaved
    for (int c = 0; c < kDim / 32; ++c) {
      const __m512i x = LoadWords(first + 32 * c);
      const __m512i y = LoadWords(second + 32 * c);
      v[2 * c] = AsBf16(_mm512_unpacklo_epi16(x, y));
      v[2 * c + 1] = AsBf16(_mm512_unpackhi_epi16(x, y));
    }
    for (int b = 0; b < NQ; ++b) {
      int32_t word;  // (p(2i), p(2i + 1))
      std::memcpy(&word, p[b] + 2 * i, sizeof(word));
      const __m512bh pj = AsBf16(_mm512_set1_epi32(word));
      for (int c = 0; c < kDim / 16; ++c) a[b][c] = _mm512_dpbf16_ps(a[b][c], pj, v[c]);
    }
  }
  for (int b = 0; b < NQ; ++b) {
    for (int c = 0; c < kDim / 16; ++c) _mm512_storeu_ps(acc[b] + 16 * c, a[b][c]);
  }
}

// out[d] = scale * acc[the slot of dimension d] for d in [0, kDim), from the
// accumulators' interleaved order (AccumulatePairs).
template <int kDim>
void UninterleaveDims(const float* acc, float scale, float* out) {
  for (int d = 0; d < kDim; ++d) {
    const int group = d / 32, within = d % 32;
    const int chunk = within / 8, offset = within % 8;  // 128-bit chunk, place in it
    const int slot = 32 * group + 16 * (offset / 4) + 4 * chunk + offset % 4;
    out[d] = acc[slot] * scale;
  }
}

#endif  // TANDEM_CPU_BF16_ATTENTION

}  // namespace tandem::kernels::cpu::bf16_attention

#endif  // TANDEM_ENGINE_KERNELS_CPU_ATTENTION_BF16_H_
