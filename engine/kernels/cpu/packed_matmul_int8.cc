// The 8-bit-activation products over integer panels (packed_matmul_int8.h)
// with AVX-512 VNNI: a quad vector is one vpdpbusd operand, and the stored
// quants' bias comes off the exact sums.
#include "engine/kernels/cpu/packed_matmul_int8.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "engine/kernels/cpu/block32.h"
#include "engine/kernels/cpu/matmul_tiling.h"
#include "engine/kernels/cpu/packed_decode.h"
#include "engine/kernels/cpu/packed_int8_formats.h"
#include "engine/kernels/cpu/simd.h"

namespace tandem::kernels::cpu {

#ifdef TANDEM_CPU_INT8_VNNI
namespace {

using int8_panels::kBlockInputs;
using int8_panels::kVectorBytes;
using int8_panels::MinForm;
using int8_panels::ScaleForm;

// The scale D of run `run` of a block for the panel's 16 rows, and the
// minimum's coefficient M (packed_int8_formats.h; exact products, as the
// float kernels read them).
template <typename F>
__m512 D(const uint8_t* header, const uint8_t* block, int run) {
  const __m512 d = HalvesAt(header + F::kDAt);
  if constexpr (F::kScale == ScaleForm::kHalvesTimesUnsigned) {
    return _mm512_mul_ps(d, UnsignedBytesAt(block + F::kScaleAt[run]));
  } else if constexpr (F::kScale == ScaleForm::kHalvesTimesSigned) {
    return _mm512_mul_ps(d, SignedBytesAt(block + F::kScaleAt[run]));
  }
  return d;
}
template <typename F>
__m512 M(const uint8_t* header, const uint8_t* block) {
  if constexpr (F::kMin == MinForm::kHalves) return HalvesAt(block + F::kMinAt);
  return _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(HalvesAt(header + F::kDminAt),
                                                          UnsignedBytesAt(block + F::kMinAt)));
}

// Level index -> level + 128, in every 16-byte lane (for vpshufb).
inline __m512i LevelBytes() {
  alignas(16) uint8_t bytes[16];
  for (int v = 0; v < 16; ++v) bytes[v] = static_cast<uint8_t>(kIq4NlLevels[v] + 128);
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(bytes)));
}

// Quad vector j of a block as vpdpbusd takes it (unsigned bytes).
template <typename F, int j>
inline __m512i LoadQuad(const uint8_t* quants, __m512i levels) {
  if constexpr (F::kTopBits == 4) {
    return _mm512_loadu_si512(quants + kVectorBytes * j);
  } else {
    const __m512i low_nibbles = _mm512_set1_epi8(0x0f);
    const __m512i nibbles = _mm512_loadu_si512(quants + kVectorBytes * (j / 2));
    __m512i u = _mm512_and_si512(j % 2 == 0 ? nibbles : _mm512_srli_epi16(nibbles, 4), low_nibbles);
    if constexpr (F::kLevels) u = _mm512_shuffle_epi8(levels, u);
    if constexpr (F::kTopBits > 0) {
      // This vector's top bits to bits 4.. of each byte. The 16-bit shifts
      // carry neighbouring bits only into positions the mask clears.
      constexpr int kPerPlane = 8 / F::kTopBits;
      const __m512i plane = _mm512_loadu_si512(quants + kVectorBytes * (4 + j / kPerPlane));
      constexpr int kAt = F::kTopBits * (j % kPerPlane);
      __m512i moved = plane;
      if constexpr (kAt < 4) moved = _mm512_slli_epi16(plane, 4 - kAt);
      if constexpr (kAt > 4) moved = _mm512_srli_epi16(plane, kAt - 4);
      const __m512i mask = _mm512_set1_epi8(static_cast<char>(((1 << F::kTopBits) - 1) << 4));
      u = _mm512_ternarylogic_epi32(u, moved, mask, 0xf8);  // u | (moved & mask)
    }
    return u;
  }
}

// Four consecutive activation quants as one broadcast 32-bit lane.
inline __m512i Quad(const int8_t* q) {
  int32_t quad;
  std::memcpy(&quad, q, sizeof(quad));
  return _mm512_set1_epi32(quad);
}

// The activation digits a block's quad j gives vpdpbusd: q8's one, q16's
// high and low (two_digit_activations.h).
inline constexpr bool TwoDigits(const ActivationBlock*) { return false; }
inline constexpr bool TwoDigits(const TwoDigitBlock*) { return true; }

// out rows [row0, row0 + R) x panels [n, n + 16P), for activations A
// (ActivationBlock or TwoDigitBlock). Two digits take one more dot product
// a quad into a second set of sums, and each run's exact integer is
// 256 * high + low (|high| <= 32 x 255 x 127 per run, so 2^8 times it and
// the bias term stay far inside int32).
template <typename F, typename A, int R, int P>
void Tile(const uint8_t* panel, int64_t panel_bytes, int64_t blocks, const A* activations,
          int64_t row0, const Matrix& out, int64_t n, const float* bias) {
  constexpr bool kTwoDigits = TwoDigits(static_cast<const A*>(nullptr));
  const __m512i levels = F::kLevels ? LevelBytes() : _mm512_setzero_si512();
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* header[P];
    const uint8_t* block[P];
    for (int p = 0; p < P; ++p) {
      header[p] = panel + p * panel_bytes + HeaderOffset<typename F::L>(b);
      block[p] = panel + p * panel_bytes + BlockOffset<typename F::L>(b);
      if (row0 == 0) PrefetchAhead<typename F::L, P>(panel, panel_bytes, p, b);
    }
    const A* a[R];
    for (int r = 0; r < R; ++r) a[r] = activations + (row0 + r) * blocks + b;
    Unroll<0, F::kRuns>([&](auto run) {
      __m512i dots[R][P];
      [[maybe_unused]] __m512i low_dots[R][kTwoDigits ? P : 1];
      for (int r = 0; r < R; ++r) {
        for (int p = 0; p < P; ++p) {
          dots[r][p] = _mm512_setzero_si512();
          if constexpr (kTwoDigits) low_dots[r][p] = _mm512_setzero_si512();
        }
      }
      constexpr int kQuadsPerRun = 8 / F::kRuns;
      Unroll<run * kQuadsPerRun, (run + 1) * kQuadsPerRun>([&](auto j) {
        __m512i w[P];
        for (int p = 0; p < P; ++p) w[p] = LoadQuad<F, j>(block[p] + F::kQuants, levels);
        for (int r = 0; r < R; ++r) {
          if constexpr (kTwoDigits) {
            const __m512i high = Quad(a[r]->hi + 4 * j);
            const __m512i low = Quad(a[r]->lo + 4 * j);
            for (int p = 0; p < P; ++p) {
              dots[r][p] = _mm512_dpbusd_epi32(dots[r][p], w[p], high);
              low_dots[r][p] = _mm512_dpbusd_epi32(low_dots[r][p], w[p], low);
            }
          } else {
            const __m512i x = Quad(a[r]->q + 4 * j);
            for (int p = 0; p < P; ++p) dots[r][p] = _mm512_dpbusd_epi32(dots[r][p], w[p], x);
          }
        }
      });
      for (int p = 0; p < P; ++p) {
        const __m512 d = D<F>(header[p], block[p], run);
        for (int r = 0; r < R; ++r) {
          __m512i i = dots[r][p];
          if constexpr (kTwoDigits) i = _mm512_add_epi32(_mm512_slli_epi32(i, 8), low_dots[r][p]);
          if constexpr (F::kBias != 0) {
            const int sum = F::kRuns == 1 ? a[r]->sums[0] + a[r]->sums[1] : a[r]->sums[run];
            i = _mm512_sub_epi32(i, _mm512_set1_epi32(F::kBias * sum));
          }
          acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(a[r]->d)),
                                      _mm512_cvtepi32_ps(i), acc[r][p]);
        }
      }
    });
    if constexpr (F::kMin != MinForm::kNone) {
      for (int p = 0; p < P; ++p) {
        const __m512 m = M<F>(header[p], block[p]);
        for (int r = 0; r < R; ++r) {
          acc[r][p] = _mm512_fmadd_ps(m, _mm512_set1_ps(a[r]->ds), acc[r][p]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    float* o = out.Row(row0 + r) + n;
    for (int p = 0; p < P; ++p) {
      const __m512 v = bias != nullptr
                           ? _mm512_add_ps(acc[r][p], _mm512_loadu_ps(bias + n + 16 * p))
                           : acc[r][p];
      _mm512_storeu_ps(o + 16 * p, v);
    }
  }
}

// One activation row takes four panels at a time (independent chains enough
// to hide the latency of the dot products); more rows take tiles of up to 4
// rows x 2 panels, each pair of panels staying in cache while every tile of
// rows passes over it.
constexpr int kTileRows = 4;

template <typename F, typename A>
void Int8Rows(const PackedWeight& weight, const A* activations, int64_t rows, int64_t n0,
              int64_t n1, const float* bias, const Matrix& out) {
  const int64_t blocks = weight.cols / kBlockInputs;
  const uint8_t* base = weight.data.get();
  auto panel_at = [&](int64_t n) { return base + n / kPanelWidth * weight.panel_bytes; };
  const int64_t max_panels = rows == 1 ? 4 : 2;
  for (int64_t n = n0; n < n1;) {
    const int panels = static_cast<int>(std::min(max_panels, (n1 - n) / kPanelWidth));
    for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
      const int tile = static_cast<int>(std::min<int64_t>(kTileRows, rows - r0));
      WithConstant<kTileRows>(tile, [&](auto r) {
        WithConstant<4>(panels, [&](auto p) {
          if constexpr (r() * p() <= 8) {
            Tile<F, A, r(), p()>(panel_at(n), weight.panel_bytes, blocks, activations, r0, out, n,
                                 bias);
          }
        });
      });
    }
    n += panels * kPanelWidth;
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

bool HasTwoDigitProducts() { return true; }

void MatMulPackedTwoDigitRows(const PackedWeight& weight, const TwoDigitBlock* activations,
                              int64_t rows, int64_t n0, int64_t n1, const float* bias,
                              const Matrix& out) {
  int8_panels::WithInt8Format(weight.dtype, [&](auto f) {
    Int8Rows<decltype(f)>(weight, activations, rows, n0, n1, bias, out);
  });
}

#else  // no AVX-512 VNNI: ParseMatMulMode refuses q16, so nothing calls this.

bool HasTwoDigitProducts() { return false; }

void MatMulPackedTwoDigitRows(const PackedWeight&, const TwoDigitBlock*, int64_t, int64_t, int64_t,
                              const float*, const Matrix&) {}

#endif  // TANDEM_CPU_INT8_VNNI

}  // namespace tandem::kernels::cpu
