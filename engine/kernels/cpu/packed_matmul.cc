#include "engine/kernels/cpu/packed_matmul.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "engine/kernels/cpu/block32.h"
#include "engine/kernels/cpu/dequantize.h"
#include "engine/kernels/cpu/matmul_tiling.h"
#include "engine/kernels/cpu/packed_decode.h"
#include "engine/kernels/cpu/simd.h"

namespace tandem::kernels::cpu {

bool HasBf16Panels(DType dtype) { return dtype != DType::kF16; }

bool HasInt8Panels(DType dtype) { return dtype != DType::kF16 && dtype != DType::kBF16; }

#ifdef TANDEM_CPU_AVX512
namespace {

constexpr int64_t kBlockInputs = 32;
// Up to this many activation rows the weights are decoded inside the product
// in tiles of up to 8 rows (ForEachOnTheFlyTile: each decoded vector serves
// the tile's rows, the later tiles read the panels from cache); with more,
// each pair of panels is dequantized into scratch once and every tile of
// rows reads it from cache.
// Measured with `tandem-matmul-bench --cpu_matmul=f32` (SmolLM2's shapes):
// on the fly takes half the scratch kernel's time at 5 rows, ~0.8x at 8,
// about the same at 16, and more from 32 rows on (its float decoding costs
// as much as the float32 products it feeds).
constexpr int64_t kOnTheFlyMaxRows = 16;
// The scratch kernel's register tile: 8 rows x 2 panels = 16 accumulators.
constexpr int kGemmRows = 8;
constexpr int kGemmPanels = 2;

// Per packed format: its layout L (packed_matmul.h), the scale loads of a
// block (from the block and its header) and the decoding of inputs 2j and
// 2j + 1 of a block for the panel's 16 rows, with exactly DequantizeRow's
// arithmetic (multiply, then add; no fusing).
struct Q4_1Format {
  using L = PlainLayout<32 + 32 + 256>;
  struct Scales {
    __m512 d, m;
  };
  static Scales Load(const uint8_t* /*header*/, const uint8_t* block) {
    return {HalvesAt(block), HalvesAt(block + 32)};
  }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, __m512* w0, __m512* w1) {
    __m512i lo, hi;
    NibbleIndices(block + 64, j, &lo, &hi);
    *w0 = _mm512_add_ps(_mm512_mul_ps(s.d, _mm512_cvtepi32_ps(lo)), s.m);
    *w1 = _mm512_add_ps(_mm512_mul_ps(s.d, _mm512_cvtepi32_ps(hi)), s.m);
  }
};

struct Q4_0Format {
  using L = PlainLayout<32 + 256>;
  struct Scales {
    __m512 d;
  };
  static Scales Load(const uint8_t* /*header*/, const uint8_t* block) { return {HalvesAt(block)}; }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, __m512* w0, __m512* w1) {
    const __m512i eight = _mm512_set1_epi32(8);
    __m512i lo, hi;
    NibbleIndices(block + 32, j, &lo, &hi);
    *w0 = _mm512_mul_ps(s.d, _mm512_cvtepi32_ps(_mm512_sub_epi32(lo, eight)));
    *w1 = _mm512_mul_ps(s.d, _mm512_cvtepi32_ps(_mm512_sub_epi32(hi, eight)));
  }
};

struct Q8_0Format {
  using L = PlainLayout<32 + 512>;
  struct Scales {
    __m512 d;
  };
  static Scales Load(const uint8_t* /*header*/, const uint8_t* block) { return {HalvesAt(block)}; }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, __m512* w0, __m512* w1) {
    *w0 = _mm512_mul_ps(s.d, SignedBytesAt(block + 32 + 32 * j));
    *w1 = _mm512_mul_ps(s.d, SignedBytesAt(block + 32 + 32 * j + 16));
  }
};

// Q5_0 (Q5_0Layout): w = d * (q - 16), the Q8_0 block it widens to
// elsewhere (WidenToQ8_0) decoded by Q8_0Format, bit for bit.
struct Q5_0Format {
  using L = Q5_0Layout;
  struct Scales {
    __m512 d;
  };
  static Scales Load(const uint8_t* /*header*/, const uint8_t* block) {
    return {HalvesAt(block + L::kD)};
  }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, __m512* w0, __m512* w1) {
    const __m512i sixteen = _mm512_set1_epi32(16);
    __m512i lo, hi;
    FiveBitIndices(block + L::kQuants, j, &lo, &hi);
    *w0 = _mm512_mul_ps(s.d, _mm512_cvtepi32_ps(_mm512_sub_epi32(lo, sixteen)));
    *w1 = _mm512_mul_ps(s.d, _mm512_cvtepi32_ps(_mm512_sub_epi32(hi, sixteen)));
  }
};

// Row i's quants q[0..32) (unsigned, 4 + kTopBits bits) in the nibble
// layout (NibbleAt); their fifth (and sixth) bits go to the words after the
// nibbles (packed_matmul.h). `quants` is zeroed.
template <int kTopBits, typename Q>
inline void PackQuants(const Q* q, int i, uint8_t* quants) {
  for (int e = 0; e < kBlockInputs; ++e) {
    const NibblePlace at = NibbleAt(e, i);
    quants[at.byte] = static_cast<uint8_t>(quants[at.byte] | (q[e] & 0x0f) << at.shift);
  }
  for (int j = 0; j < kBlockInputs / 2; ++j) {
    for (int t = 0; t < kTopBits; ++t) {
      uint32_t word;
      uint8_t* at = quants + kFifthBitsOffset + 64 * t + 4 * j;
      std::memcpy(&word, at, sizeof(word));
      word |= static_cast<uint32_t>((q[2 * j] >> (4 + t)) & 1) << (2 * i) |
              static_cast<uint32_t>((q[2 * j + 1] >> (4 + t)) & 1) << (2 * i + 1);
      std::memcpy(at, &word, sizeof(word));
    }
  }
}

// Block32 types (block32.h) with a minimum: Q4_K (Q4KLayout, nibbles), Q5_K
// (Q5KLayout) and Q5_1 (ScaledMinLayout), five bits. w = (d * scale) * q -
// dmin * min, multiply then subtract as DequantizeRow (every product is
// exact, so it is DequantizeRow's weight bit for bit).
template <typename Layout, bool kFiveBits>
struct ScaledMinFormat {
  using L = Layout;
  struct Scales {
    __m512 d, m;
  };
  static Scales Load(const uint8_t* header, const uint8_t* block) {
    return {_mm512_mul_ps(HalvesAt(header + L::kD), UnsignedBytesAt(block + L::kScale)),
            _mm512_mul_ps(HalvesAt(header + L::kDmin), UnsignedBytesAt(block + L::kMin))};
  }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, __m512* w0, __m512* w1) {
    __m512i lo, hi;
    if constexpr (kFiveBits) {
      FiveBitIndices(block + L::kQuants, j, &lo, &hi);
    } else {
      NibbleIndices(block + L::kQuants, j, &lo, &hi);
    }
    *w0 = _mm512_sub_ps(_mm512_mul_ps(s.d, _mm512_cvtepi32_ps(lo)), s.m);
    *w1 = _mm512_sub_ps(_mm512_mul_ps(s.d, _mm512_cvtepi32_ps(hi)), s.m);
  }
  // Writes the rows' block (and, each time again, their header).
  static void Pack(const Block32 (&rows)[kPanelWidth], uint8_t* header, uint8_t* dst) {
    for (int i = 0; i < kPanelWidth; ++i) {
      std::memcpy(header + L::kD + 2 * i, &rows[i].d, 2);
      std::memcpy(header + L::kDmin + 2 * i, &rows[i].dmin, 2);
      dst[L::kScale + i] = static_cast<uint8_t>(rows[i].scale[0]);
      dst[L::kMin + i] = rows[i].min;
      PackQuants<kFiveBits ? 1 : 0>(rows[i].q, i, dst + L::kQuants);
    }
  }
};

// Q6_K, with a scale per 16 inputs: w = (d * scale[j / 16]) * q.
struct TwoScaleFormat {
  using L = Q6KLayout;
  struct Scales {
    __m512 first, second;
  };
  static Scales Load(const uint8_t* header, const uint8_t* block) {
    const __m512 d = HalvesAt(header + L::kD);
    return {_mm512_mul_ps(d, SignedBytesAt(block + L::kScale0)),
            _mm512_mul_ps(d, SignedBytesAt(block + L::kScale1))};
  }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, __m512* w0, __m512* w1) {
    const __m512 scale = j < kBlockInputs / 4 ? s.first : s.second;
    const __m512i thirty_two = _mm512_set1_epi32(32);
    __m512i lo, hi;  // quant + 32
    SixBitIndices(block + L::kQuants, j, &lo, &hi);
    *w0 = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_sub_epi32(lo, thirty_two)));
    *w1 = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_sub_epi32(hi, thirty_two)));
  }
  static void Pack(const Block32 (&rows)[kPanelWidth], uint8_t* header, uint8_t* dst) {
    for (int i = 0; i < kPanelWidth; ++i) {
      std::memcpy(header + L::kD + 2 * i, &rows[i].d, 2);
      dst[L::kScale0 + i] = static_cast<uint8_t>(rows[i].scale[0]);
      dst[L::kScale1 + i] = static_cast<uint8_t>(rows[i].scale[1]);
      int stored[kBlockInputs];
      for (int e = 0; e < kBlockInputs; ++e) stored[e] = rows[i].q[e] + 32;
      PackQuants<2>(stored, i, dst + L::kQuants);
    }
  }
};

// IQ4_NL and IQ4_XS: w = (d * scale) * level, the level looked up by its
// nibble index.
struct LevelsFormat {
  using L = LevelsLayout;
  struct Scales {
    __m512 d, levels;
  };
  static Scales Load(const uint8_t* /*header*/, const uint8_t* block) {
    static constexpr auto kLevels = [] {
      std::array<float, 16> levels{};
      for (int v = 0; v < 16; ++v) levels[v] = kIq4NlLevels[v];
      return levels;
    }();
    return {_mm512_mul_ps(HalvesAt(block + L::kD), SignedBytesAt(block + L::kScale)),
            _mm512_loadu_ps(kLevels.data())};
  }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, __m512* w0, __m512* w1) {
    __m512i lo, hi;
    NibbleIndices(block + L::kQuants, j, &lo, &hi);
    *w0 = _mm512_mul_ps(s.d, _mm512_permutexvar_ps(lo, s.levels));
    *w1 = _mm512_mul_ps(s.d, _mm512_permutexvar_ps(hi, s.levels));
  }
  static void Pack(const Block32 (&rows)[kPanelWidth], uint8_t* /*header*/, uint8_t* dst) {
    for (int i = 0; i < kPanelWidth; ++i) {
      std::memcpy(dst + L::kD + 2 * i, &rows[i].d, 2);
      dst[L::kScale + i] = static_cast<uint8_t>(rows[i].scale[0]);
      PackQuants<0>(rows[i].q, i, dst + L::kQuants);
    }
  }
};

// F16 (HalfLayout): w = the half as a float (exact, as DequantizeRow).
struct HalfFormat {
  using L = HalfLayout;
  struct Scales {};
  static Scales Load(const uint8_t* /*header*/, const uint8_t* /*block*/) { return {}; }
  static void DecodePair(const uint8_t* block, const Scales& /*s*/, int j, __m512* w0, __m512* w1) {
    const auto* group = reinterpret_cast<const __m256i*>(block + 64 * j);
    *w0 = _mm512_cvtph_ps(_mm256_loadu_si256(group));
    *w1 = _mm512_cvtph_ps(_mm256_loadu_si256(group + 1));
  }
};

// BF16 (HalfLayout, in pairs): w = the bfloat16 as a float (its top half).
struct Bf16PairFormat {
  using L = HalfLayout;
  struct Scales {};
  static Scales Load(const uint8_t* /*header*/, const uint8_t* /*block*/) { return {}; }
  static void DecodePair(const uint8_t* block, const Scales& /*s*/, int j, __m512* w0, __m512* w1) {
    const __m512i pair = _mm512_loadu_si512(block + 64 * j);
    *w0 = _mm512_castsi512_ps(_mm512_slli_epi32(pair, 16));
    *w1 = _mm512_castsi512_ps(_mm512_and_si512(pair, _mm512_set1_epi32(-65536)));
  }
};

template <int R, int P>
inline void StoreTile(__m512 (&acc)[R][P], const Matrix& out, int64_t row0, int64_t n,
                      const float* bias) {
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

// out rows [row0, row0 + R) x panels [n, n + 16P): decodes each block as it
// goes; `first` says whether this is the first tile of rows over these
// panels (the one that reads them from memory, and prefetches).
template <typename F, int R, int P>
void OnTheFlyTile(const uint8_t* panel, int64_t panel_bytes, int64_t blocks, const Matrix& x,
                  int64_t row0, bool first, const Matrix& out, int64_t n, const float* bias) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block[P];
    typename F::Scales scales[P];
    for (int p = 0; p < P; ++p) {
      const uint8_t* at = panel + p * panel_bytes;
      block[p] = at + BlockOffset<typename F::L>(b);
      scales[p] = F::Load(at + HeaderOffset<typename F::L>(b), block[p]);
      if (first) PrefetchAhead<typename F::L, P>(panel, panel_bytes, p, b);
    }
    for (int j = 0; j < kBlockInputs / 2; ++j) {
      __m512 w0[P], w1[P];
      for (int p = 0; p < P; ++p) F::DecodePair(block[p], scales[p], j, &w0[p], &w1[p]);
      for (int r = 0; r < R; ++r) {
        const float* xr = x.Row(row0 + r) + b * kBlockInputs + 2 * j;
        const __m512 x0 = _mm512_set1_ps(xr[0]);
        for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(x0, w0[p], acc[r][p]);
        const __m512 x1 = _mm512_set1_ps(xr[1]);
        for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(x1, w1[p], acc[r][p]);
      }
    }
  }
  StoreTile<R, P>(acc, out, row0, n, bias);
}

// dst[k][16P] = the weights of input k for the P panels' rows, in order.
template <typename F, int P>
void DequantizePanels(const uint8_t* panel, int64_t panel_bytes, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b) {
    for (int p = 0; p < P; ++p) {
      const uint8_t* at = panel + p * panel_bytes;
      const uint8_t* block = at + BlockOffset<typename F::L>(b);
      const typename F::Scales scales = F::Load(at + HeaderOffset<typename F::L>(b), block);
      for (int j = 0; j < kBlockInputs / 2; ++j) {
        __m512 w0, w1;
        F::DecodePair(block, scales, j, &w0, &w1);
        float* d = dst + (b * kBlockInputs + 2 * j) * 16 * P + 16 * p;
        _mm512_storeu_ps(d, w0);
        _mm512_storeu_ps(d + 16 * P, w1);
      }
    }
  }
}

// out rows [row0, row0 + R) x panels [n, n + 16P) from dequantized panels.
template <int R, int P>
void GemmTile(const float* weights, int64_t inputs, const Matrix& x, int64_t row0,
              const Matrix& out, int64_t n, const float* bias) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  const float* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = x.Row(row0 + r);
  for (int64_t k = 0; k < inputs; ++k) {
    __m512 w[P];
    for (int p = 0; p < P; ++p) w[p] = _mm512_loadu_ps(weights + k * 16 * P + 16 * p);
    for (int r = 0; r < R; ++r) {
      const __m512 xk = _mm512_set1_ps(xr[r][k]);
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(xk, w[p], acc[r][p]);
    }
  }
  StoreTile<R, P>(acc, out, row0, n, bias);
}

template <typename F>
void PackedRows(const PackedWeight& weight, const Matrix& x, int64_t n0, int64_t n1,
                const float* bias, std::vector<float>& scratch, const Matrix& out) {
  const int64_t blocks = weight.cols / kBlockInputs;
  const uint8_t* base = weight.data.get();
  auto panel_at = [&](int64_t n) { return base + n / kPanelWidth * weight.panel_bytes; };
  if (x.rows <= kOnTheFlyMaxRows) {
    ForEachOnTheFlyTile(x.rows, n0, n1, [&](auto r, auto p, int64_t n, int64_t row0) {
      OnTheFlyTile<F, r(), p()>(panel_at(n), weight.panel_bytes, blocks, x, row0, row0 == 0, out, n,
                                bias);
    });
    return;
  }
  scratch.resize(static_cast<size_t>(weight.cols * kPanelWidth * kGemmPanels));
  for (int64_t n = n0; n < n1;) {
    const int panels = static_cast<int>(std::min<int64_t>(kGemmPanels, (n1 - n) / kPanelWidth));
    WithConstant<kGemmPanels>(panels, [&](auto p) {
      DequantizePanels<F, p()>(panel_at(n), weight.panel_bytes, blocks, scratch.data());
      for (int64_t r0 = 0; r0 < x.rows; r0 += kGemmRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kGemmRows, x.rows - r0));
        WithConstant<kGemmRows>(rows, [&](auto r) {
          GemmTile<r(), p()>(scratch.data(), weight.cols, x, r0, out, n, bias);
        });
      }
    });
    n += panels * kPanelWidth;
  }
}

// Element e of a 4-bit block: the low nibbles hold elements 0..15, the high
// ones 16..31 (GGUF's order).
inline uint8_t Nibble(const uint8_t* qs, int e) {
  return e < 16 ? static_cast<uint8_t>(qs[e] & 0x0f) : static_cast<uint8_t>(qs[e - 16] >> 4);
}

template <typename Block>
void PackBlock(const Block* const* rows, int64_t b, uint8_t* dst) {
  auto* d = reinterpret_cast<uint16_t*>(dst);
  for (int i = 0; i < kPanelWidth; ++i) d[i] = rows[i][b].d;
  if constexpr (std::is_same_v<Block, BlockQ5_0>) {
    for (int i = 0; i < kPanelWidth; ++i) {
      int q[kBlockInputs];
      FiveBitValues(rows[i][b].qs, rows[i][b].qh, q);
      PackQuants<1>(q, i, dst + Q5_0Layout::kQuants);
    }
  } else if constexpr (std::is_same_v<Block, BlockQ8_0>) {
    for (int j = 0; j < kBlockInputs; ++j) {
      for (int i = 0; i < kPanelWidth; ++i) {
        dst[32 + 16 * j + i] = static_cast<uint8_t>(rows[i][b].qs[j]);
      }
    }
  } else {
    int64_t quants = 32;
    if constexpr (std::is_same_v<Block, BlockQ4_1>) {
      for (int i = 0; i < kPanelWidth; ++i) d[16 + i] = rows[i][b].m;
      quants = 64;
    }
    for (int i = 0; i < kPanelWidth; ++i) {
      uint8_t q[kBlockInputs];
      for (int e = 0; e < kBlockInputs; ++e) q[e] = Nibble(rows[i][b].qs, e);
      PackQuants<0>(q, i, dst + quants);
    }
  }
}

template <typename Block>
void PackPanels(const Weight& weight, PackedWeight& packed) {
  const size_t row_bytes = RowBytes(weight.dtype, weight.cols);
  const auto* base = static_cast<const uint8_t*>(weight.data);
  const int64_t blocks = weight.cols / kBlockInputs;
  const int64_t block_bytes = packed.panel_bytes / blocks;  // plain layouts: no headers
  for (int64_t p = 0; p < weight.rows / kPanelWidth; ++p) {
    const Block* rows[kPanelWidth];
    for (int i = 0; i < kPanelWidth; ++i) {
      rows[i] = reinterpret_cast<const Block*>(base + static_cast<size_t>(p * kPanelWidth + i) *
                                                          row_bytes);
    }
    for (int64_t b = 0; b < blocks; ++b) {
      PackBlock(rows, b, packed.data.get() + p * packed.panel_bytes + b * block_bytes);
    }
  }
}

// F16 or BF16 panels (HalfLayout): each block's 16 rows x 32 values, input
// by input (F16) or pair by pair (BF16, kPairs).
template <bool kPairs>
void PackHalfPanels(const Weight& weight, PackedWeight& packed) {
  const auto* src = static_cast<const uint16_t*>(weight.data);
  constexpr int64_t kBlockValues = HalfLayout::kBlockBytes / 2;
  for (int64_t p = 0; p < weight.rows / kPanelWidth; ++p) {
    auto* panel = reinterpret_cast<uint16_t*>(packed.data.get() + p * packed.panel_bytes);
    for (int64_t b = 0; b < weight.cols / kBlockInputs; ++b) {
      uint16_t* block = panel + b * kBlockValues;
      for (int64_t i = 0; i < kPanelWidth; ++i) {
        const uint16_t* row = src + (p * kPanelWidth + i) * weight.cols + b * kBlockInputs;
        for (int64_t k = 0; k < kBlockInputs; ++k) {
          const int64_t at = kPairs ? k / 2 * 32 + 2 * i + k % 2 : k * kPanelWidth + i;
          block[at] = row[k];
        }
      }
    }
  }
}

// The panels of a Block32 type in format F.
template <typename F>
void PackBlock32Panels(const Weight& weight, PackedWeight& packed) {
  const size_t row_bytes = RowBytes(weight.dtype, weight.cols);
  const auto* base = static_cast<const uint8_t*>(weight.data);
  for (int64_t p = 0; p < weight.rows / kPanelWidth; ++p) {
    for (int64_t b = 0; b < weight.cols / kBlockInputs; ++b) {
      Block32 rows[kPanelWidth];
      for (int i = 0; i < kPanelWidth; ++i) {
        rows[i] = ReadBlock32(weight.dtype,
                              base + static_cast<size_t>(p * kPanelWidth + i) * row_bytes, b);
      }
      uint8_t* panel = packed.data.get() + p * packed.panel_bytes;
      F::Pack(rows, panel + HeaderOffset<typename F::L>(b), panel + BlockOffset<typename F::L>(b));
    }
  }
}

// Calls f(F{}) with the packed format of `dtype`.
template <typename Fn>
auto WithFormat(DType dtype, Fn&& f) {
  switch (dtype) {
    case DType::kQ4_1:
      return f(Q4_1Format{});
    case DType::kQ4_0:
      return f(Q4_0Format{});
    case DType::kQ5_0:
      return f(Q5_0Format{});
    case DType::kQ4_K:
      return f(ScaledMinFormat<Q4KLayout, false>{});
    case DType::kQ5_K:
      return f(ScaledMinFormat<Q5KLayout, true>{});
    case DType::kQ5_1:
      return f(ScaledMinFormat<ScaledMinLayout, true>{});
    case DType::kQ6_K:
      return f(TwoScaleFormat{});
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return f(LevelsFormat{});
    case DType::kF16:
      return f(HalfFormat{});
    case DType::kBF16:
      return f(Bf16PairFormat{});
    default:
      return f(Q8_0Format{});
  }
}

}  // namespace

bool CanPackWeight(DType dtype, int64_t rows, int64_t cols) {
  const bool half = dtype == DType::kF16 || dtype == DType::kBF16;
  return (dtype == DType::kQ4_0 || dtype == DType::kQ4_1 || dtype == DType::kQ5_0 ||
          dtype == DType::kQ8_0 || HasBlock32(dtype) || half) &&
         rows > 0 && rows % kPanelWidth == 0 && cols > 0 &&
         cols % std::max<int64_t>(Info(dtype).block_elements, kBlockInputs) == 0;
}

int64_t PackedWeightBytes(DType dtype, int64_t rows, int64_t cols) {
  return rows / kPanelWidth *
         WithFormat(dtype, [&](auto f) { return PanelBytes<typename decltype(f)::L>(cols); });
}

std::unique_ptr<PackedWeight> AllocatePanels(const Weight& weight, int64_t panel_bytes) {
  auto packed = std::make_unique<PackedWeight>();
  packed->dtype = weight.dtype;
  packed->rows = weight.rows;
  packed->cols = weight.cols;
  packed->panel_bytes = panel_bytes;
  const size_t bytes = static_cast<size_t>(weight.rows / kPanelWidth * panel_bytes);
  constexpr size_t kAlignment = 64;
  packed->data = {static_cast<uint8_t*>(std::aligned_alloc(
                      kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment)),
                  std::free};
  std::memset(packed->data.get(), 0, bytes);
  return packed;
}

std::unique_ptr<PackedWeight> PackWeight(const Weight& weight) {
  std::unique_ptr<PackedWeight> packed =
      AllocatePanels(weight, PackedWeightBytes(weight.dtype, kPanelWidth, weight.cols));
  switch (weight.dtype) {
    case DType::kQ4_1:
      PackPanels<BlockQ4_1>(weight, *packed);
      break;
    case DType::kQ4_0:
      PackPanels<BlockQ4_0>(weight, *packed);
      break;
    case DType::kQ5_0:
      PackPanels<BlockQ5_0>(weight, *packed);
      break;
    case DType::kQ8_0:
      PackPanels<BlockQ8_0>(weight, *packed);
      break;
    case DType::kF16:
      PackHalfPanels<false>(weight, *packed);
      break;
    case DType::kBF16:
      PackHalfPanels<true>(weight, *packed);
      break;
    default:
      WithFormat(weight.dtype, [&](auto f) {
        using F = decltype(f);
        if constexpr (requires { &F::Pack; }) PackBlock32Panels<F>(weight, *packed);
      });
      break;
  }
  return packed;
}

void MatMulPackedRows(const PackedWeight& weight, const Matrix& x, int64_t n0, int64_t n1,
                      const float* bias, std::vector<float>& scratch, const Matrix& out) {
  WithFormat(weight.dtype,
             [&](auto f) { PackedRows<decltype(f)>(weight, x, n0, n1, bias, scratch, out); });
}

#else  // no AVX-512: nothing is packed (CanPackWeight is false), so the
       // other two functions are never reached.

bool CanPackWeight(DType, int64_t, int64_t) { return false; }

int64_t PackedWeightBytes(DType, int64_t, int64_t) { return 0; }

std::unique_ptr<PackedWeight> AllocatePanels(const Weight&, int64_t) { return nullptr; }

std::unique_ptr<PackedWeight> PackWeight(const Weight&) { return nullptr; }

void MatMulPackedRows(const PackedWeight&, const Matrix&, int64_t, int64_t, const float*,
                      std::vector<float>&, const Matrix&) {}

#endif  // TANDEM_CPU_AVX512

}  // namespace tandem::kernels::cpu
