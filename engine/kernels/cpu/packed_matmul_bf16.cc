// The bfloat16-activation products over packed panels (packed_matmul.h).
#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "engine/kernels/cpu/matmul_tiling.h"
#include "engine/kernels/cpu/packed_matmul.h"
#include "engine/kernels/cpu/simd.h"

namespace tandem::kernels::cpu {

#if defined(TANDEM_CPU_AVX512) && defined(__AVX512BF16__)
namespace {

constexpr int64_t kBlockInputs = 32;
constexpr int kPairs = kBlockInputs / 2;
constexpr int64_t kOnTheFlyMaxRows = 4;
// The scratch kernel's tile: 8 rows x 2 panels of block-local sums in
// registers (16), their running totals in an L1 array.
constexpr int kGemmRows = 8;
constexpr int kGemmPanels = 2;

// The bfloat16 bits of a small integer (exact: at most 8 significant bits).
constexpr uint16_t Bf16Of(int v) {
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(v)) >> 16);
}

inline __m512 Scales(const uint8_t* block, int which) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * which)));
}

// Per packed format: the quants of inputs 2j and 2j + 1 for the panel's 16
// rows as one vector of bfloat16 pairs (lane i = row i; its low half is
// input 2j), and whether a block has a minimum (Q4_1).
template <int kOffset>
struct NibbleTable {
  // Nibble v -> bfloat16(v - kOffset), in the low 16 of 32 words.
  static __m512i Table() {
    alignas(64) uint16_t words[32] = {};
    for (int v = 0; v < 16; ++v) words[v] = Bf16Of(v - kOffset);
    return _mm512_load_si512(words);
  }
};

template <int kOffset, int64_t kQuants>
inline __m512i DecodeNibblePair(const uint8_t* block, int j, __m512i table) {
  // Byte i (row i) holds input 2j in its low nibble and 2j + 1 in its high:
  // move the high nibble to bits 16..19, keep both nibbles only, and look
  // each 16-bit index up in the table.
  const __m512i t = _mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQuants + 16 * j)));
  const __m512i indices =
      _mm512_ternarylogic_epi32(t, _mm512_slli_epi32(t, 12), _mm512_set1_epi32(0x000f000f), 0xa8);
  return _mm512_permutexvar_epi16(indices, table);
}

struct Q4_1Bf16 {
  static constexpr int64_t kBlockBytes = 32 + 32 + 256;
  static constexpr bool kHasMin = true;
  static __m512i Table() { return NibbleTable<0>::Table(); }
  static __m512i Pair(const uint8_t* block, int j, __m512i table) {
    return DecodeNibblePair<0, 64>(block, j, table);
  }
};

struct Q4_0Bf16 {
  static constexpr int64_t kBlockBytes = 32 + 256;
  static constexpr bool kHasMin = false;
  static __m512i Table() { return NibbleTable<8>::Table(); }
  static __m512i Pair(const uint8_t* block, int j, __m512i table) {
    return DecodeNibblePair<8, 32>(block, j, table);
  }
};

struct Q8_0Bf16 {
  static constexpr int64_t kBlockBytes = 32 + 512;
  static constexpr bool kHasMin = false;
  static __m512i Table() { return _mm512_setzero_si512(); }
  static __m512i Pair(const uint8_t* block, int j, __m512i /*table*/) {
    // Groups 2j and 2j + 1 hold the 16 rows' quants of inputs 2j and 2j + 1;
    // as floats they are exact, so their top halves are their bfloat16s.
    const uint8_t* q = block + 32 + 32 * j;
    const __m512i a = _mm512_castps_si512(_mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)))));
    const __m512i b = _mm512_castps_si512(_mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)))));
    // (a >> 16) | (b & 0xffff0000)
    return _mm512_ternarylogic_epi32(_mm512_srli_epi32(a, 16), b, _mm512_set1_epi32(-65536), 0xf8);
  }
};

inline __m512 Dot(__m512 acc, __m512i x_pair, __m512i w_pair) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(x_pair),
                          reinterpret_cast<__m512bh&>(w_pair));
}

// Activation row r's bfloat16 pair (inputs 2j, 2j+1 of block b), broadcast.
inline __m512i XPair(const uint16_t* xr, int64_t b, int j) {
  uint32_t pair;
  std::memcpy(&pair, xr + b * kBlockInputs + 2 * j, sizeof(pair));
  return _mm512_set1_epi32(static_cast<int>(pair));
}

// Folds a block's sums into the totals: acc = fma(d, inner, acc), then for
// Q4_1 acc = fma(m, block sum of x, acc). The same order in both kernels.
template <typename F>
inline __m512 Fold(__m512 acc, __m512 inner, __m512 d, __m512 m, float x_sum) {
  acc = _mm512_fmadd_ps(d, inner, acc);
  if constexpr (F::kHasMin) acc = _mm512_fmadd_ps(m, _mm512_set1_ps(x_sum), acc);
  return acc;
}

template <int R, int P>
inline void Store(const float (&acc)[R][P][16], const Matrix& out, int64_t row0, int64_t n,
                  const float* bias) {
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) {
      __m512 v = _mm512_loadu_ps(acc[r][p]);
      if (bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + n + 16 * p));
      _mm512_storeu_ps(out.Row(row0 + r) + n + 16 * p, v);
    }
  }
}

template <typename F, int R, int P>
void OnTheFlyTile(const uint8_t* panel, int64_t panel_bytes, int64_t blocks, const uint16_t* xb,
                  const float* sums, int64_t cols, const Matrix& out, int64_t n,
                  const float* bias) {
  const __m512i table = F::Table();
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block[P];
    for (int p = 0; p < P; ++p) block[p] = panel + p * panel_bytes + b * F::kBlockBytes;
    __m512 inner[R][P];
    for (int r = 0; r < R; ++r) {
      for (int p = 0; p < P; ++p) inner[r][p] = _mm512_setzero_ps();
    }
    for (int j = 0; j < kPairs; ++j) {
      __m512i w[P];
      for (int p = 0; p < P; ++p) w[p] = F::Pair(block[p], j, table);
      for (int r = 0; r < R; ++r) {
        const __m512i x = XPair(xb + r * cols, b, j);
        for (int p = 0; p < P; ++p) inner[r][p] = Dot(inner[r][p], x, w[p]);
      }
    }
    for (int p = 0; p < P; ++p) {
      const __m512 d = Scales(block[p], 0);
      const __m512 m = F::kHasMin ? Scales(block[p], 1) : _mm512_setzero_ps();
      for (int r = 0; r < R; ++r) {
        acc[r][p] = Fold<F>(acc[r][p], inner[r][p], d, m, sums[r * blocks + b]);
      }
    }
  }
  float totals[R][P][16];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(totals[r][p], acc[r][p]);
  }
  Store<R, P>(totals, out, 0, n, bias);
}

// Scratch for P panels: per block, the 16 pair vectors of each panel, then
// each panel's d and m as floats.
template <int P>
constexpr int64_t ScratchFloatsPerBlock() {
  return int64_t{kPairs} * P * 16 + 2 * P * 16;
}

template <typename F, int P>
void DecodePanels(const uint8_t* panel, int64_t panel_bytes, int64_t blocks, float* scratch) {
  const __m512i table = F::Table();
  for (int64_t b = 0; b < blocks; ++b) {
    float* dst = scratch + b * ScratchFloatsPerBlock<P>();
    for (int p = 0; p < P; ++p) {
      const uint8_t* block = panel + p * panel_bytes + b * F::kBlockBytes;
      for (int j = 0; j < kPairs; ++j) {
        _mm512_storeu_si512(dst + (j * P + p) * 16, F::Pair(block, j, table));
      }
      float* scales = dst + kPairs * P * 16;
      _mm512_storeu_ps(scales + p * 16, Scales(block, 0));
      _mm512_storeu_ps(scales + (P + p) * 16, F::kHasMin ? Scales(block, 1) : _mm512_setzero_ps());
    }
  }
}

template <typename F, int R, int P>
void GemmTile(const float* scratch, int64_t blocks, const uint16_t* xb, const float* sums,
              int64_t cols, int64_t row0, const Matrix& out, int64_t n, const float* bias) {
  float totals[R][P][16] = {};
  for (int64_t b = 0; b < blocks; ++b) {
    const float* src = scratch + b * ScratchFloatsPerBlock<P>();
    __m512 inner[R][P];
    for (int r = 0; r < R; ++r) {
      for (int p = 0; p < P; ++p) inner[r][p] = _mm512_setzero_ps();
    }
    for (int j = 0; j < kPairs; ++j) {
      __m512i w[P];
      for (int p = 0; p < P; ++p) w[p] = _mm512_loadu_si512(src + (j * P + p) * 16);
      for (int r = 0; r < R; ++r) {
        const __m512i x = XPair(xb + (row0 + r) * cols, b, j);
        for (int p = 0; p < P; ++p) inner[r][p] = Dot(inner[r][p], x, w[p]);
      }
    }
    const float* scales = src + kPairs * P * 16;
    for (int p = 0; p < P; ++p) {
      const __m512 d = _mm512_loadu_ps(scales + p * 16);
      const __m512 m = _mm512_loadu_ps(scales + (P + p) * 16);
      for (int r = 0; r < R; ++r) {
        _mm512_storeu_ps(totals[r][p], Fold<F>(_mm512_loadu_ps(totals[r][p]), inner[r][p], d, m,
                                               sums[(row0 + r) * blocks + b]));
      }
    }
  }
  Store<R, P>(totals, out, row0, n, bias);
}

template <typename F>
void Bf16Rows(const PackedWeight& weight, const uint16_t* xb, const float* sums, int64_t rows,
              int64_t n0, int64_t n1, const float* bias, std::vector<float>& scratch,
              const Matrix& out) {
  const int64_t blocks = weight.cols / kBlockInputs;
  const uint8_t* base = weight.data.get();
  auto panel_at = [&](int64_t n) { return base + n / kPanelWidth * weight.panel_bytes; };
  if (rows <= kOnTheFlyMaxRows) {
    const int64_t max_panels = rows <= 2 ? 4 : 2;
    for (int64_t n = n0; n < n1;) {
      const int panels = static_cast<int>(std::min(max_panels, (n1 - n) / kPanelWidth));
      WithConstant<4>(static_cast<int>(rows), [&](auto r) {
        WithConstant<4>(panels, [&](auto p) {
          OnTheFlyTile<F, r(), p()>(panel_at(n), weight.panel_bytes, blocks, xb, sums, weight.cols,
                                    out, n, bias);
        });
      });
      n += panels * kPanelWidth;
    }
    return;
  }
  scratch.resize(static_cast<size_t>(blocks * ScratchFloatsPerBlock<kGemmPanels>()));
  for (int64_t n = n0; n < n1;) {
    const int panels = static_cast<int>(std::min<int64_t>(kGemmPanels, (n1 - n) / kPanelWidth));
    WithConstant<kGemmPanels>(panels, [&](auto p) {
      DecodePanels<F, p()>(panel_at(n), weight.panel_bytes, blocks, scratch.data());
      for (int64_t r0 = 0; r0 < rows; r0 += kGemmRows) {
        WithConstant<kGemmRows>(static_cast<int>(std::min<int64_t>(kGemmRows, rows - r0)),
                                [&](auto r) {
                                  GemmTile<F, r(), p()>(scratch.data(), blocks, xb, sums,
                                                        weight.cols, r0, out, n, bias);
                                });
      }
    });
    n += panels * kPanelWidth;
  }
}

}  // namespace

bool HasBf16Products() { return true; }

void RoundActivationsToBf16(const float* x, int64_t cols, uint16_t* xb, float* sums) {
  for (int64_t b = 0; b < cols / kBlockInputs; ++b) {
    const float* xs = x + b * kBlockInputs;
    uint16_t* dst = xb + b * kBlockInputs;
    for (int h = 0; h < 2; ++h) {
      const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_loadu_ps(xs + 16 * h));
      std::memcpy(dst + 16 * h, &rounded, sizeof(rounded));
    }
    float sum = 0.0f;
    for (int i = 0; i < kBlockInputs; ++i) {
      sum += std::bit_cast<float>(static_cast<uint32_t>(dst[i]) << 16);
    }
    sums[b] = sum;
  }
}

void MatMulPackedBf16Rows(const PackedWeight& weight, const uint16_t* xb, const float* sums,
                          int64_t rows, int64_t n0, int64_t n1, const float* bias,
                          std::vector<float>& scratch, const Matrix& out) {
  switch (weight.dtype) {
    case DType::kQ4_1:
      return Bf16Rows<Q4_1Bf16>(weight, xb, sums, rows, n0, n1, bias, scratch, out);
    case DType::kQ4_0:
      return Bf16Rows<Q4_0Bf16>(weight, xb, sums, rows, n0, n1, bias, scratch, out);
    default:
      return Bf16Rows<Q8_0Bf16>(weight, xb, sums, rows, n0, n1, bias, scratch, out);
  }
}

#else  // no AVX-512 BF16: ParseMatMulMode refuses bf16, so nothing calls these.

bool HasBf16Products() { return false; }

void RoundActivationsToBf16(const float*, int64_t, uint16_t*, float*) {}

void MatMulPackedBf16Rows(const PackedWeight&, const uint16_t*, const float*, int64_t, int64_t,
                          int64_t, const float*, std::vector<float>&, const Matrix&) {}

#endif

}  // namespace tandem::kernels::cpu
