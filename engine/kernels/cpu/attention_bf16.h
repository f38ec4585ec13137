// The vector kernels of attention over a bfloat16 KV cache (the bf16
// --cpu_matmul mode), and the layout that cache keeps inside each block so
// that the kernels need no shuffles: AVX-512 BF16 dot products
// (vdpbf16ps: pairs of bfloat16 products summed into float32 lanes).
// Included by attention.cc and cpu_backend.cc (WriteKv) only.
//
// The layout. A block's slice of one layer's K (or V) pool holds, for each
// KV head in turn, block_size x head_dim words (the same bytes as the
// halves layout, so block ids, block copies and KV transfers are unchanged):
// - keys in tiles of 16 slots, each tile a run of head_dim / 2 vectors:
//   vector p holds dimensions (2p, 2p + 1) of the tile's 16 keys, one
//   32-bit lane a key, so one dot-product instruction scores a dimension
//   pair of 16 keys with no horizontal sum;
// - values in pairs of slots (2i, 2i + 1), dimension by dimension:
//   (v[2i][d], v[2i + 1][d]) as one 32-bit lane, so a pair's value rows are
//   already the operand of the dot product with the pair's probabilities.
// Writing an even slot clears its odd partner's value words: a sequence's
// positions are written in order, so a partner that a query does not see
// (weight 0) holds a finite value, and 0 x value adds nothing.
// Blocks must be whole tiles (block_size a multiple of 16: SupportedBlock).
//
// Every query's arithmetic is fixed by its own inputs alone:
// - a score is scale x (the chain of dot products over even dimension pairs
//   + the chain over odd ones), in the lane of its key, whatever tile,
//   block or other queries it is computed with;
// - a value sum takes keys in pairs at even positions (2i, 2i + 1),
//   probabilities rounded to bfloat16, in position order, into two sums by
//   the parity of i, added at the end; a pair whose second key the query
//   does not see has probability 0 there.
// So a query gets the same bits alone, among a verification's rows or in a
// prompt chunk, as the float32 kernels guarantee for their mode.
#ifndef TANDEM_ENGINE_KERNELS_CPU_ATTENTION_BF16_H_
#define TANDEM_ENGINE_KERNELS_CPU_ATTENTION_BF16_H_

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

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

// Calls fn(std::integral_constant<int, head_dim>{}) for a head size with
// vector kernels (64, 128 or 256; the float32 kernels have the same).
template <typename Fn>
inline void WithHeadDim(int head_dim, Fn&& fn) {
  if (head_dim == 64) return fn(std::integral_constant<int, 64>{});
  if (head_dim == 128) return fn(std::integral_constant<int, 128>{});
  return fn(std::integral_constant<int, 256>{});
}

// Keys per tile (one 32-bit lane of a 512-bit vector each).
inline constexpr int kTileKeys = 16;

// Whether blocks of `block_size` slots hold whole tiles.
inline bool SupportedBlock(int block_size) { return block_size % kTileKeys == 0; }

// Where KV head `kv_head`'s words of block `block` start in a pool (K or
// V), in words: each block holds its KV heads' words in turn.
inline int64_t HeadOffset(int64_t block, int kv_head, int kv_heads, int block_size, int head_dim) {
  return (block * kv_heads + kv_head) * int64_t{block_size} * head_dim;
}

#ifdef TANDEM_CPU_BF16_ATTENTION

inline __m512bh AsBf16(__m512i x) { return reinterpret_cast<__m512bh&>(x); }
inline __m512i LoadWords(const void* p) { return _mm512_loadu_si512(p); }

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
// exp(scores[j] - max)), with *max_out = max. Returns the float32 sum of
// the exponentials. Every element goes through the same instructions, the
// last ones masked, and the sum through 16 lanes then one fixed reduction.
inline float ExpToBf16(const float* scores, int64_t n, uint16_t* out, float* max_out) {
  auto mask = [n](int64_t j) {
    return n - j >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (n - j)) - 1);
  };
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < n; j += 16) {
    vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, mask(j), scores + j));
  }
  *max_out = _mm512_reduce_max_ps(vmax);
  const __m512 max = _mm512_set1_ps(*max_out);
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

// Stores key row k[0..kDim) (floats, rounded to bfloat16 to nearest even)
// at slot `slot` of a block, into `head`: the block's words of one KV head.
template <int kDim>
inline void StoreKey(const float* k, int slot, uint16_t* head) {
  uint32_t* tile = reinterpret_cast<uint32_t*>(head) + (slot / kTileKeys) * (kTileKeys * kDim / 2);
  const int lane = slot % kTileKeys;
  for (int c = 0; c < kDim / 32; ++c) {
    // Dimension pairs 16c .. 16c + 15 of this key, one 32-bit lane each.
    const __m512bh pairs =
        _mm512_cvtne2ps_pbh(_mm512_loadu_ps(k + 32 * c + 16), _mm512_loadu_ps(k + 32 * c));
    alignas(64) uint32_t words[16];
    _mm512_store_si512(words, reinterpret_cast<const __m512i&>(pairs));
    for (int p = 0; p < 16; ++p) tile[(16 * c + p) * kTileKeys + lane] = words[p];
  }
}

// Stores value row v[0..kDim) at slot `slot` of a block, into `head` (as
// StoreKey); an even slot also clears its odd partner's words.
template <int kDim>
inline void StoreValue(const float* v, int slot, uint16_t* head) {
  uint16_t* pair = head + (slot / 2) * (2 * kDim);
  const int half = slot % 2;
  for (int c = 0; c < kDim / 16; ++c) {
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(v + 16 * c));
    alignas(32) uint16_t words[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(words), reinterpret_cast<const __m256i&>(b));
    for (int d = 0; d < 16; ++d) {
      pair[2 * (16 * c + d) + half] = words[d];
      if (half == 0) pair[2 * (16 * c + d) + 1] = 0;
    }
  }
}

// The 32-bit word of dimension pair p of a bfloat16 row (QueryToBf16's).
inline int32_t PairWord(const uint16_t* row, int p) {
  int32_t word;
  std::memcpy(&word, row + 2 * p, sizeof(word));
  return word;
}

// scores[b][16 t + j] = scale * (q[b] . key j of tile t), for the tiles
// tiles[0..NT) and NQ queries (q[b]: the query in bfloat16). Two chains a
// key and query, over the even and the odd dimension pairs, then added:
// the same instructions for every key in every lane, so a score does not
// depend on its tile or its companions.
template <int NQ, int NT, int kDim>
inline void ScoreTiles(const uint16_t* const* q, const uint16_t* const* tiles, float scale,
                       float* const* scores) {
  __m512 even[NQ][NT], odd[NQ][NT];
  for (int b = 0; b < NQ; ++b) {
    for (int t = 0; t < NT; ++t) even[b][t] = odd[b][t] = _mm512_setzero_ps();
  }
  for (int p = 0; p < kDim / 2; p += 2) {
    for (int t = 0; t < NT; ++t) {
      const __m512bh k0 = AsBf16(LoadWords(tiles[t] + p * 2 * kTileKeys));
      const __m512bh k1 = AsBf16(LoadWords(tiles[t] + (p + 1) * 2 * kTileKeys));
      for (int b = 0; b < NQ; ++b) {
        even[b][t] = _mm512_dpbf16_ps(even[b][t], AsBf16(_mm512_set1_epi32(PairWord(q[b], p))), k0);
        odd[b][t] =
            _mm512_dpbf16_ps(odd[b][t], AsBf16(_mm512_set1_epi32(PairWord(q[b], p + 1))), k1);
      }
    }
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int b = 0; b < NQ; ++b) {
    for (int t = 0; t < NT; ++t) {
      _mm512_storeu_ps(scores[b] + kTileKeys * t,
                       _mm512_mul_ps(_mm512_add_ps(even[b][t], odd[b][t]), vscale));
    }
  }
}

// Adds to query b's two accumulators (even[b]: pairs of even index, odd[b]:
// of odd index; kDim floats each) the pairs pairs[0..count), whose first
// has index parity `parity`: (p[b][2i], p[b][2i + 1]) . pairs[i] in order
// of i, bfloat16 probabilities and value pairs (a pair's kDim 32-bit lanes,
// in dimension order). Two accumulators by the pair's absolute index, so a
// query's sums do not depend on where its pairs are split, and a single
// query keeps eight chains of dot products in flight; dimensions go 64 at
// a time, or 32 for four queries (each dimension's sums are its own), so
// the sums stay in 16 registers.
template <int NQ, int kDim>
void AccumulatePairs(float* const* even, float* const* odd, const uint16_t* const* p,
                     const uint16_t* const* pairs, int count, int parity) {
  constexpr int kChunks = NQ >= 3 ? 2 : 4;  // of 16 dimensions
  for (int slice = 0; slice < kDim / (16 * kChunks); ++slice) {
    __m512 a[2][NQ][kChunks];  // [pair index parity][query][chunk]
    for (int b = 0; b < NQ; ++b) {
      for (int c = 0; c < kChunks; ++c) {
        a[0][b][c] = _mm512_loadu_ps(even[b] + 16 * (kChunks * slice + c));
        a[1][b][c] = _mm512_loadu_ps(odd[b] + 16 * (kChunks * slice + c));
      }
    }
    auto add_pair = [&](int i, __m512(&sums)[NQ][kChunks]) {
      __m512bh v[kChunks];
      for (int c = 0; c < kChunks; ++c) {
        v[c] = AsBf16(LoadWords(pairs[i] + 32 * (kChunks * slice + c)));
      }
      for (int b = 0; b < NQ; ++b) {
        int32_t word;  // (p(2i), p(2i + 1))
        std::memcpy(&word, p[b] + 2 * i, sizeof(word));
        const __m512bh pj = AsBf16(_mm512_set1_epi32(word));
        for (int c = 0; c < kChunks; ++c) sums[b][c] = _mm512_dpbf16_ps(sums[b][c], pj, v[c]);
      }
    };
    int i = 0;
    if (parity != 0 && count > 0) add_pair(i++, a[1]);
    for (; i + 2 <= count; i += 2) {
      add_pair(i, a[0]);
      add_pair(i + 1, a[1]);
    }
    if (i < count) add_pair(i, a[0]);
    for (int b = 0; b < NQ; ++b) {
      for (int c = 0; c < kChunks; ++c) {
        _mm512_storeu_ps(even[b] + 16 * (kChunks * slice + c), a[0][b][c]);
        _mm512_storeu_ps(odd[b] + 16 * (kChunks * slice + c), a[1][b][c]);
      }
    }
  }
}

#endif  // TANDEM_CPU_BF16_ATTENTION

}  // namespace tandem::kernels::cpu::bf16_attention

#endif  // TANDEM_ENGINE_KERNELS_CPU_ATTENTION_BF16_H_
