// The 8-bit-activation products over integer panels (packed_matmul_int8.h)
// for CPUs with AVX2 and no AVX-512 VNNI (AMD Zen 2 and 3, Intel client
// cores, Skylake-X): the same panels as the VNNI kernel, a 64-byte quad
// vector taken as two 8-lane halves (the panel's rows 0-7 and 8-15).
//
// vpmaddubsw multiplies unsigned by signed bytes and adds each pair of
// products into a saturating 16-bit sum; vpmaddwd against ones then adds
// the pairs of those into the 32-bit lane that vpdpbusd would fill. Nothing
// saturates, so every sum is the exact integer VNNI computes and the float
// arithmetic after it is packed_matmul_int8.h's, step for step: a row's
// results are the VNNI build's bits.
//   - Nibbles, five and six bits (stored quants up to 15, 31, 63): a pair sum
//     is at most 2 * 63 * 127 = 16,002, and the pair sums of 8, 4 or 2 quad
//     vectors add in 16 bits before one vpmaddwd widens them.
//   - Whole bytes (Q8_0, stored + 128) and IQ4 levels (+ 128): up to 255,
//     whose pair sums can reach 64,770. These take the stored quant less 128
//     (the quant, or the level: -128..127) and the sign trick: |s| times x
//     with s's sign, at most 2 * 128 * 127 = 32,512, and no bias to take off.
//     (The activations are -127..127: QuantizeActivationRow.)
#include <cstdint>
#include <cstring>

#include "engine/kernels/cpu/block32.h"
#include "engine/kernels/cpu/packed_decode.h"
#include "engine/kernels/cpu/packed_int8_formats.h"
#include "engine/kernels/cpu/packed_matmul_int8.h"
#include "engine/kernels/cpu/simd.h"

namespace tandem::kernels::cpu {

#ifdef TANDEM_CPU_INT8_AVX2
namespace {

using int8_panels::kBlockInputs;
using int8_panels::kVectorBytes;
using int8_panels::MaxStoredQuant;
using int8_panels::MinForm;
using int8_panels::ScaleForm;

// Half h of a panel: its rows 8h..8h+7, at these offsets in a quad vector,
// a run of halves and a run of scale bytes.
constexpr int64_t kHalfVectorBytes = kVectorBytes / 2;

// 8 half floats, 8 bytes, as floats.
inline __m256 Halves8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 UnsignedBytes8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 SignedBytes8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// D of run `run` and M for half h (the VNNI kernel's, 8 lanes at a time).
template <typename F>
__m256 D(const uint8_t* header, const uint8_t* block, int run, int h) {
  const __m256 d = Halves8(header + F::kDAt + 16 * h);
  if constexpr (F::kScale == ScaleForm::kHalvesTimesUnsigned) {
    return _mm256_mul_ps(d, UnsignedBytes8(block + F::kScaleAt[run] + 8 * h));
  } else if constexpr (F::kScale == ScaleForm::kHalvesTimesSigned) {
    return _mm256_mul_ps(d, SignedBytes8(block + F::kScaleAt[run] + 8 * h));
  }
  return d;
}
template <typename F>
__m256 M(const uint8_t* header, const uint8_t* block, int h) {
  if constexpr (F::kMin == MinForm::kHalves) return Halves8(block + F::kMinAt + 16 * h);
  return _mm256_sub_ps(_mm256_setzero_ps(),
                       _mm256_mul_ps(Halves8(header + F::kDminAt + 16 * h),
                                     UnsignedBytes8(block + F::kMinAt + 8 * h)));
}

// Whether the format's quants are multiplied signed (stored less 128).
template <typename F>
constexpr bool kSigned = MaxStoredQuant<F>() > 127;
// Quad vectors of a run whose 16-bit pair sums add before widening.
template <typename F>
constexpr int QuadsPerWidening() {
  constexpr int kQuadsPerRun = 8 / F::kRuns;
  if constexpr (kSigned<F>) return 1;
  constexpr int kFit = 32767 / (2 * 127 * MaxStoredQuant<F>());
  return kFit >= kQuadsPerRun ? kQuadsPerRun : (kFit >= 4 ? 4 : (kFit >= 2 ? 2 : 1));
}

// IQ4 level index -> level, in both 16-byte lanes (for vpshufb).
inline __m256i SignedLevels() {
  alignas(16) int8_t levels[16];
  for (int v = 0; v < 16; ++v) levels[v] = kIq4NlLevels[v];
  return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(levels)));
}

// Half of quad vector j of a block, from `quants` = the block's quants plus
// the half's offset: unsigned stored quants, or the signed ones. (j is a
// constant once the caller's loops unroll.)
template <typename F>
inline __m256i LoadQuad(const uint8_t* quants, int j, __m256i levels) {
  if constexpr (F::kTopBits == 4) {
    const __m256i u =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + kVectorBytes * j));
    return _mm256_xor_si256(u, _mm256_set1_epi8(static_cast<char>(0x80)));
  } else {
    const __m256i low_nibbles = _mm256_set1_epi8(0x0f);
    const __m256i nibbles =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + kVectorBytes * (j / 2)));
    __m256i u = _mm256_and_si256(j % 2 == 0 ? nibbles : _mm256_srli_epi16(nibbles, 4), low_nibbles);
    if constexpr (F::kLevels) u = _mm256_shuffle_epi8(levels, u);
    if constexpr (F::kTopBits > 0) {
      // This vector's top bits to bits 4.. of each byte. The 16-bit shifts
      // carry neighbouring bits only into positions the mask clears.
      constexpr int kPerPlane = 8 / F::kTopBits;
      const __m256i plane = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(quants + kVectorBytes * (4 + j / kPerPlane)));
      const int at = F::kTopBits * (j % kPerPlane);
      __m256i moved = plane;
      if (at < 4) moved = _mm256_slli_epi16(plane, 4 - at);
      if (at > 4) moved = _mm256_srli_epi16(plane, at - 4);
      const __m256i mask = _mm256_set1_epi8(static_cast<char>(((1 << F::kTopBits) - 1) << 4));
      u = _mm256_or_si256(u, _mm256_and_si256(moved, mask));
    }
    return u;
  }
}

// Pair sums (16 bits) of a quad vector's half times four activation quants
// broadcast to every lane.
template <typename F>
inline __m256i PairSums(__m256i w, __m256i x) {
  if constexpr (kSigned<F>) {
    return _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
  } else {
    return _mm256_maddubs_epi16(w, x);
  }
}

// An empty asm that takes v in a register and gives it back changed, as
// far as the compiler knows: the sum is then made here, product by product.
// Without it GCC computed all 32 products of a 4-row tile's run before
// adding any, and spilled them (16 registers).
inline void KeepInRegister(__m256i& v) { asm("" : "+x"(v)); }

// Four consecutive activation quants as one broadcast 32-bit lane.
inline __m256i Quad(const int8_t* q) {
  int32_t quad;
  std::memcpy(&quad, q, sizeof(quad));
  return _mm256_set1_epi32(quad);
}

// out rows [row0, row0 + R) x the panel at `panel` (whose first output row
// is n): two columns of 8 outputs, its halves. Plain loops of constant counts, which unroll: the
// sums then stay in registers (lambdas that captured the arrays kept them in memory).
template <typename F, int R>
void Tile(const uint8_t* panel, int64_t panel_bytes, int64_t blocks,
          const ActivationBlock* activations, int64_t row0, const Matrix& out, int64_t n,
          const float* bias) {
  using L = typename F::L;
  constexpr int C = 2;
  const __m256i levels = F::kLevels ? SignedLevels() : _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  constexpr int kQuadsPerRun = 8 / F::kRuns;
  constexpr int kPerWidening = QuadsPerWidening<F>();
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* header = panel + HeaderOffset<L>(b);
    const uint8_t* block = panel + BlockOffset<L>(b);
    if (row0 == 0) PrefetchAhead<L, 1>(panel, panel_bytes, 0, b);
    const ActivationBlock* a[R];
    for (int r = 0; r < R; ++r) a[r] = activations + (row0 + r) * blocks + b;
#pragma GCC unroll 2
    for (int run = 0; run < F::kRuns; ++run) {
      __m256i dots[R][C];
#pragma GCC unroll 8
      for (int g = 0; g < kQuadsPerRun / kPerWidening; ++g) {
        __m256i pairs[R][C];
#pragma GCC unroll 8
        for (int k = 0; k < kPerWidening; ++k) {
          const int j = run * kQuadsPerRun + g * kPerWidening + k;
          for (int c = 0; c < C; ++c) {
            const __m256i w = LoadQuad<F>(block + F::kQuants + kHalfVectorBytes * c, j, levels);
            for (int r = 0; r < R; ++r) {
              const __m256i p = PairSums<F>(w, Quad(a[r]->q + 4 * j));
              pairs[r][c] = k == 0 ? p : _mm256_add_epi16(pairs[r][c], p);
              KeepInRegister(pairs[r][c]);
            }
          }
        }
        for (int r = 0; r < R; ++r) {
          for (int c = 0; c < C; ++c) {
            const __m256i wide = _mm256_madd_epi16(pairs[r][c], ones);
            dots[r][c] = g == 0 ? wide : _mm256_add_epi32(dots[r][c], wide);
          }
        }
      }
      for (int c = 0; c < C; ++c) {
        const __m256 d = D<F>(header, block, run, c);
        for (int r = 0; r < R; ++r) {
          __m256i i = dots[r][c];
          if constexpr (F::kBias != 0 && !kSigned<F>) {
            const int sum = F::kRuns == 1 ? a[r]->sums[0] + a[r]->sums[1] : a[r]->sums[run];
            i = _mm256_sub_epi32(i, _mm256_set1_epi32(F::kBias * sum));
          }
          acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(a[r]->d)),
                                      _mm256_cvtepi32_ps(i), acc[r][c]);
        }
      }
    }
    if constexpr (F::kMin != MinForm::kNone) {
      for (int c = 0; c < C; ++c) {
        const __m256 m = M<F>(header, block, c);
        for (int r = 0; r < R; ++r) {
          acc[r][c] = _mm256_fmadd_ps(m, _mm256_set1_ps(a[r]->ds), acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      const int64_t at = n + 8 * c;
      const __m256 v =
          bias != nullptr ? _mm256_add_ps(acc[r][c], _mm256_loadu_ps(bias + at)) : acc[r][c];
      _mm256_storeu_ps(out.Row(row0 + r) + at, v);
    }
  }
}

// Tiles of 2 rows x 1 panel (2 x 2 x 2 sums, the most that fit 16
// registers with the decoded quants: 3 rows, or 4 rows x half a panel,
// spilled and were slower), every tile of rows passing over the panel while
// it is in cache. One row takes one panel at a time: two panels at once
// (two streams of memory) was no faster.
constexpr int kTileRows = 2;

template <typename F>
void Int8Rows(const PackedWeight& weight, const ActivationBlock* activations, int64_t rows,
              int64_t n0, int64_t n1, const float* bias, const Matrix& out) {
  const int64_t blocks = weight.cols / kBlockInputs;
  for (int64_t n = n0; n < n1; n += kPanelWidth) {
    const uint8_t* panel = weight.data.get() + n / kPanelWidth * weight.panel_bytes;
    for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
      if (rows - r0 >= kTileRows) {
        Tile<F, kTileRows>(panel, weight.panel_bytes, blocks, activations, r0, out, n, bias);
      } else {
        Tile<F, 1>(panel, weight.panel_bytes, blocks, activations, r0, out, n, bias);
      }
    }
  }
}

}  // namespace

bool HasInt8Products() { return true; }

void MatMulPackedInt8Rows(const PackedWeight& weight, const ActivationBlock* activations,
                          int64_t rows, int64_t n0, int64_t n1, const float* bias,
                          const Matrix& out) {
  int8_panels::WithInt8Format(weight.dtype, [&](auto f) {
    Int8Rows<decltype(f)>(weight, activations, rows, n0, n1, bias, out);
  });
}

#endif  // TANDEM_CPU_INT8_AVX2

}  // namespace tandem::kernels::cpu
