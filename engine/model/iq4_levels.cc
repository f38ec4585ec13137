#include "engine/model/iq4_levels.h"

#include <algorithm>
#include <array>
#include <cstddef>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "engine/kernels/dtype.h"

// GCC 12 reports the undefined pass-through operand inside AVX-512
// intrinsics (_mm512_undefined_*) as uninitialized once they are inlined
// (GCC bug 105593, fixed in GCC 13). This file holds only the level search.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tandem::model {
namespace {

// The IQ4 levels as floats, ascending (what both searches compare against).
alignas(64) constexpr std::array<float, 16> kLevels = [] {
  std::array<float, 16> levels{};
  for (int i = 0; i < 16; ++i) levels[static_cast<size_t>(i)] = kernels::kIq4NlLevels[i];
  return levels;
}();

}  // namespace

// ggml's best_index_int8 without its branches (they mispredict on every
// other element): the bracketing level is found by counting the levels at
// or below x.
int NearestIq4Level(float x) {
  int below = 0;  // the last level <= x, when x > kLevels[0]
  for (size_t k = 1; k < 16; ++k) below += kLevels[k] <= x ? 1 : 0;
  const int above = std::min(below + 1, 15);
  const float lo = kLevels[static_cast<size_t>(below)];
  const float hi = kLevels[static_cast<size_t>(above)];
  const int nearer = x - lo < hi - x ? below : above;
  return x <= kLevels[0] ? 0 : (x >= kLevels[15] ? 15 : nearer);
}

void NearestIq4Levels32(float scale, const float* x, uint8_t* out) {
#ifdef __AVX512F__
  const __m512 table = _mm512_load_ps(kLevels.data());
  const __m512 first = _mm512_set1_ps(kLevels[0]), last = _mm512_set1_ps(kLevels[15]);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int h = 0; h < 32; h += 16) {
    const __m512 v = _mm512_mul_ps(vscale, _mm512_loadu_ps(x + h));
    __m512i below = _mm512_setzero_si512();
    for (size_t k = 1; k < 16; ++k) {
      const __mmask16 at_or_above = _mm512_cmp_ps_mask(_mm512_set1_ps(kLevels[k]), v, _CMP_LE_OQ);
      below = _mm512_mask_add_epi32(below, at_or_above, below, _mm512_set1_epi32(1));
    }
    const __m512i above =
        _mm512_min_epi32(_mm512_add_epi32(below, _mm512_set1_epi32(1)), _mm512_set1_epi32(15));
    const __m512 lo = _mm512_permutexvar_ps(below, table);
    const __m512 hi = _mm512_permutexvar_ps(above, table);
    const __mmask16 lower =
        _mm512_cmp_ps_mask(_mm512_sub_ps(v, lo), _mm512_sub_ps(hi, v), _CMP_LT_OQ);
    __m512i index = _mm512_mask_blend_epi32(lower, above, below);
    index = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, first, _CMP_LE_OQ), index,
                                    _mm512_setzero_si512());
    index = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, last, _CMP_GE_OQ), index,
                                    _mm512_set1_epi32(15));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + h), _mm512_cvtepi32_epi8(index));
  }
#else
  for (int j = 0; j < 32; ++j) out[j] = static_cast<uint8_t>(NearestIq4Level(scale * x[j]));
#endif
}

}  // namespace tandem::model
