// Loads and decodings of packed panels (packed_matmul.h) shared by the
// float32 and the bfloat16 kernels: AVX-512 builds; the part that does not
// depend on the vector width (top-bit words, prefetch) also AVX2 ones.
#ifndef TANDEM_ENGINE_KERNELS_CPU_PACKED_DECODE_H_
#define TANDEM_ENGINE_KERNELS_CPU_PACKED_DECODE_H_

#include <cstdint>
#include <cstring>

#include "engine/kernels/cpu/matmul_tiling.h"
#include "engine/kernels/cpu/packed_matmul.h"
#include "engine/kernels/cpu/simd.h"

#ifdef TANDEM_CPU_AVX2
namespace tandem::kernels::cpu {

// The top-bit word of pair j (bit 2i: row i's input 2j, bit 2i + 1: its
// input 2j + 1) from the words at `plane` (packed_matmul.h's fifth or sixth
// bits).
inline uint32_t TopBitWord(const uint8_t* plane, int j) {
  uint32_t word;
  std::memcpy(&word, plane + 4 * j, sizeof(word));
  return word;
}

// Software prefetch for the kernels that stream a product's panels from
// memory once (few activation rows). The hardware prefetchers ramp up per
// stream, and a small model's panels end before they have (SmolLM2-135M's
// are 5.8 KB in Q4_1): without this a decode step's 30 layers of products
// read at ~19 GB/s on the 2-core Zen 4 of docs/performance.md, with it ~30
// (`tandem-matmul-bench --rows=1 --lm_head=false`).
//
// A tile multiplies P consecutive panels block by block, so it reads P
// streams. For panel p of the tile starting at `tile`, this prefetches the
// bytes kPrefetchDistance past block b (its header included); a line past
// the panel's end is taken at the same place in the next tile's panel p,
// which the next tile reads. Addresses past the weight's end are harmless
// (a prefetch never faults; they are computed as integers).
inline constexpr int64_t kPrefetchDistance = 2048;

template <typename L, int P>
inline void PrefetchAhead(const uint8_t* tile, int64_t panel_bytes, int p, int64_t b) {
  const uintptr_t panel =
      reinterpret_cast<uintptr_t>(tile) + static_cast<uintptr_t>(p * panel_bytes);
  for (int64_t line = 0; line < L::kHeaderBytes + L::kBlockBytes; line += 64) {
    int64_t offset = BlockOffset<L>(b) + kPrefetchDistance + line;
    if (offset >= panel_bytes) offset += (P - 1) * panel_bytes;
    _mm_prefetch(reinterpret_cast<const char*>(panel + static_cast<uintptr_t>(offset)),
                 _MM_HINT_T0);
  }
}

}  // namespace tandem::kernels::cpu
#endif  // TANDEM_CPU_AVX2

#ifdef TANDEM_CPU_AVX512
namespace tandem::kernels::cpu {

// The tiling's panels (ForEachOnTheFlyTile) are the packed panels.
static_assert(kPanelRows == kPanelWidth);

// 16 half floats as floats.
inline __m512 HalvesAt(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// 16 bytes as floats.
inline __m512 UnsignedBytesAt(const uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 SignedBytesAt(const uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// The quants of inputs 2j (lo) and 2j + 1 (hi) of the 16 rows, from a
// nibble group run starting at `quants` (packed_matmul.h's layout), as
// floats: levels[nibble]. The group's 32-bit lane i, shifted right by
// 4 (j % 4), holds row i's nibble of input 2j in its low four bits and of
// 2j + 1 in bits 16-19, and vpermps reads only the low four bits of each
// lane's index: a shift and a lookup for each, where a mask and a
// conversion to float would take two instructions after the shift.
// (levels: the 16 small integers the nibbles stand for, as a conversion
// would give them exactly.)
inline void NibbleLevels(const uint8_t* quants, int j, __m512 levels, __m512* lo, __m512* hi) {
  const __m512i group = _mm512_loadu_si512(quants + 64 * (j / 4));
  const __m512i pair = _mm512_srli_epi32(group, static_cast<unsigned>(4 * (j % 4)));
  *lo = _mm512_permutexvar_ps(pair, levels);
  *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(pair, 16), levels);
}
// The floats first, first + 1, ..., first + 15: NibbleLevels' table for
// quants less an offset (Q4_0: first = -8).
inline __m512 Levels(int first) {
  return _mm512_add_ps(_mm512_set1_ps(static_cast<float>(first)),
                       _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

// Bits 0, 2, ..., 30 (or, shifted by one, 1, 3, ..., 31) of w as 16 bits.
inline __mmask16 EvenBits(uint32_t w) {
#ifdef __BMI2__
  return static_cast<__mmask16>(_pext_u32(w, 0x55555555u));
#else
  uint32_t out = 0;
  for (int i = 0; i < 16; ++i) out |= ((w >> (2 * i)) & 1u) << i;
  return static_cast<__mmask16>(out);
#endif
}

// The five-bit quants (0-31) of inputs 2j (lo) and 2j + 1 (hi) of the 16
// rows less `offset`, as floats: NibbleLevels' lookup, then 16 added where
// the fifth bit is set (small integers, so every sum is exact).
inline void FiveBitLevels(const uint8_t* quants, int j, int offset, __m512* lo, __m512* hi) {
  NibbleLevels(quants, j, Levels(-offset), lo, hi);
  const uint32_t word = TopBitWord(quants + kFifthBitsOffset, j);
  const __m512 sixteen = _mm512_set1_ps(16.0f);
  *lo = _mm512_mask_add_ps(*lo, EvenBits(word), *lo, sixteen);
  *hi = _mm512_mask_add_ps(*hi, EvenBits(word >> 1), *hi, sixteen);
}

// The six-bit quants (0-63) less `offset`, as floats: FiveBitLevels, then
// 32 added where the sixth bit is set.
inline void SixBitLevels(const uint8_t* quants, int j, int offset, __m512* lo, __m512* hi) {
  FiveBitLevels(quants, j, offset, lo, hi);
  const uint32_t word = TopBitWord(quants + kSixthBitsOffset, j);
  const __m512 thirty_two = _mm512_set1_ps(32.0f);
  *lo = _mm512_mask_add_ps(*lo, EvenBits(word), *lo, thirty_two);
  *hi = _mm512_mask_add_ps(*hi, EvenBits(word >> 1), *hi, thirty_two);
}

}  // namespace tandem::kernels::cpu
#endif  // TANDEM_CPU_AVX512

#endif  // TANDEM_ENGINE_KERNELS_CPU_PACKED_DECODE_H_
