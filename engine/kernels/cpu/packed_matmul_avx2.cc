// The float32 products of packed panels (packed_matmul.h) for CPUs with AVX2
// and no AVX-512 (AMD Zen 2 and 3, Intel client cores): a 16-row panel is two
// 8-lane vectors, rows 0-7 and 8-15.
//
// Arithmetic: packed_matmul.h's contract, the one the AVX-512 kernels keep
// (packed_matmul.cc). Each output element is one chain of fused
// multiply-adds over its inputs in order, each weight exactly DequantizeRow's
// (decoded by the same multiplies and adds, never fused). So these kernels
// give every row the same bits whatever the batch, and the same bits as
// the AVX-512 build's float32 products.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/kernels/cpu/matmul_tiling.h"
#include "engine/kernels/cpu/packed_decode.h"
#include "engine/kernels/cpu/packed_matmul.h"
#include "engine/kernels/cpu/simd.h"
#include "engine/kernels/dtype.h"

#if defined(TANDEM_CPU_AVX2) && !defined(TANDEM_CPU_AVX512)
namespace tandem::kernels::cpu {
namespace {

constexpr int64_t kBlockInputs = 32;

// Up to this many activation rows the weights are decoded inside the product
// (OnTheFlyTile: tiles of 2 rows x 1 panel, the second tile reading the
// panel from cache); with more, each panel is dequantized into scratch once
// and every tile of rows reads it from cache (GemmTile). Measured with
// `tandem-matmul-bench --cpu_matmul=f32 --lm_head=false` on a 2-core AMD
// Zen 3 (SmolLM2's 30 layers; this machine's times swing by 40%): on the
// fly 6.2-7.1 ms for 1 row, 7.6-8.7 for 2, 13.1 for 3 and 14.5-14.7 for 4,
// where dequantizing first took 15.7-19.5 and 16.2-22.2. Tiles of 3 and 4
// rows, or of one row over two panels, spill (16 registers) and took longer
// than the 2-row tiles; so did decoding one panel's pair and using it
// before decoding the next, and decoding each 32-input block into L1 once
// for all the rows (3-16 rows, docs/performance.md, 2026-12-07).
constexpr int64_t kOnTheFlyMaxRows = 4;
constexpr int kOnTheFlyRows = 2;
// The scratch kernel's register tile: 6 rows x one panel = 12 sums, two
// weight vectors and a broadcast activation (BLIS's 6x16 for AVX2).
constexpr int kGemmRows = 6;

// The 16 rows of a panel as two 8-lane vectors.
struct Rows16 {
  __m256 h[2];
};
struct Ints16 {
  __m256i h[2];
};

inline Rows16 Mul(const Rows16& a, const Rows16& b) {
  return {{_mm256_mul_ps(a.h[0], b.h[0]), _mm256_mul_ps(a.h[1], b.h[1])}};
}
// a * b + c and a * b - c in one rounding: DequantizeRow's multiply then
// add or subtract bit for bit wherever a * b is exact (packed_matmul.cc).
inline Rows16 MulAdd(const Rows16& a, const Rows16& b, const Rows16& c) {
  return {{_mm256_fmadd_ps(a.h[0], b.h[0], c.h[0]), _mm256_fmadd_ps(a.h[1], b.h[1], c.h[1])}};
}
inline Rows16 MulSub(const Rows16& a, const Rows16& b, const Rows16& c) {
  return {{_mm256_fmsub_ps(a.h[0], b.h[0], c.h[0]), _mm256_fmsub_ps(a.h[1], b.h[1], c.h[1])}};
}
inline Rows16 ToFloats(const Ints16& v) {
  return {{_mm256_cvtepi32_ps(v.h[0]), _mm256_cvtepi32_ps(v.h[1])}};
}
inline Ints16 Minus(const Ints16& v, int c) {
  const __m256i k = _mm256_set1_epi32(c);
  return {{_mm256_sub_epi32(v.h[0], k), _mm256_sub_epi32(v.h[1], k)}};
}

// 16 half floats as floats.
inline Rows16 HalvesAt(const uint8_t* p) {
  const auto* v = reinterpret_cast<const __m128i*>(p);
  return {{_mm256_cvtph_ps(_mm_loadu_si128(v)), _mm256_cvtph_ps(_mm_loadu_si128(v + 1))}};
}
// 16 bytes as floats.
inline Rows16 UnsignedBytesAt(const uint8_t* p) {
  const auto* v = reinterpret_cast<const __m128i*>(p);
  const __m128i bytes = _mm_loadu_si128(v);
  return {{_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)),
           _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(bytes, bytes)))}};
}
inline Rows16 SignedBytesAt(const uint8_t* p) {
  const auto* v = reinterpret_cast<const __m128i*>(p);
  const __m128i bytes = _mm_loadu_si128(v);
  return {{_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)),
           _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(bytes, bytes)))}};
}

// The nibbles of inputs 2j (lo) and 2j + 1 (hi) of the 16 rows, from a
// nibble group run starting at `quants` (packed_matmul.h's layout: 32-bit
// lane i of a group is row i's).
inline void NibbleIndices(const uint8_t* quants, int j, Ints16* lo, Ints16* hi) {
  const auto* group = reinterpret_cast<const __m256i*>(quants + 64 * (j / 4));
  const __m256i mask = _mm256_set1_epi32(0x0f);
  for (int h = 0; h < 2; ++h) {
    const __m256i pair = _mm256_srli_epi32(_mm256_loadu_si256(group + h), 4 * (j % 4));
    lo->h[h] = _mm256_and_si256(pair, mask);
    hi->h[h] = _mm256_and_si256(_mm256_srli_epi32(pair, 16), mask);
  }
}

// Sets bit `bit` of row i's lo where bit 2i of `word` is set and of its hi
// where bit 2i + 1 is (the fifth or sixth bits of pair j, packed_matmul.h;
// lo and hi have that bit clear).
inline void AddTopBits(uint32_t word, int bit, Ints16* lo, Ints16* hi) {
  const __m256i all = _mm256_set1_epi32(static_cast<int32_t>(word));
  const __m256i one = _mm256_set1_epi32(1);
  for (int h = 0; h < 2; ++h) {
    const __m256i even = _mm256_setr_epi32(16 * h + 0, 16 * h + 2, 16 * h + 4, 16 * h + 6,
                                           16 * h + 8, 16 * h + 10, 16 * h + 12, 16 * h + 14);
    const __m256i bit_lo = _mm256_and_si256(_mm256_srlv_epi32(all, even), one);
    const __m256i bit_hi =
        _mm256_and_si256(_mm256_srlv_epi32(all, _mm256_add_epi32(even, one)), one);
    lo->h[h] = _mm256_or_si256(lo->h[h], _mm256_slli_epi32(bit_lo, bit));
    hi->h[h] = _mm256_or_si256(hi->h[h], _mm256_slli_epi32(bit_hi, bit));
  }
}

// The five-bit quants (0-31) of inputs 2j (lo) and 2j + 1 (hi) of the 16
// rows; the six-bit ones (0-63).
inline void FiveBitIndices(const uint8_t* quants, int j, Ints16* lo, Ints16* hi) {
  NibbleIndices(quants, j, lo, hi);
  AddTopBits(TopBitWord(quants + kFifthBitsOffset, j), 4, lo, hi);
}
inline void SixBitIndices(const uint8_t* quants, int j, Ints16* lo, Ints16* hi) {
  FiveBitIndices(quants, j, lo, hi);
  AddTopBits(TopBitWord(quants + kSixthBitsOffset, j), 5, lo, hi);
}

// Per packed format: its layout, the scale loads of a block and the decoding
// of inputs 2j and 2j + 1 for the panel's 16 rows, DequantizeRow's weights
// bit for bit (as packed_matmul.cc's formats of the same names, which say
// why a fused multiply-add gives them).
struct Q4_1Format {
  using L = Q4_1Layout;
  struct Scales {
    Rows16 d, m;
  };
  static Scales Load(const uint8_t* /*header*/, const uint8_t* block) {
    return {HalvesAt(block), HalvesAt(block + 32)};
  }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, Rows16* w0, Rows16* w1) {
    Ints16 lo, hi;
    NibbleIndices(block + 64, j, &lo, &hi);
    *w0 = MulAdd(s.d, ToFloats(lo), s.m);
    *w1 = MulAdd(s.d, ToFloats(hi), s.m);
  }
};

struct Q4_0Format {
  using L = Q4_0Layout;
  struct Scales {
    Rows16 d;
  };
  static Scales Load(const uint8_t* /*header*/, const uint8_t* block) { return {HalvesAt(block)}; }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, Rows16* w0, Rows16* w1) {
    Ints16 lo, hi;
    NibbleIndices(block + 32, j, &lo, &hi);
    *w0 = Mul(s.d, ToFloats(Minus(lo, 8)));
    *w1 = Mul(s.d, ToFloats(Minus(hi, 8)));
  }
};

struct Q8_0Format {
  using L = Q8_0Layout;
  struct Scales {
    Rows16 d;
  };
  static Scales Load(const uint8_t* /*header*/, const uint8_t* block) { return {HalvesAt(block)}; }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, Rows16* w0, Rows16* w1) {
    *w0 = Mul(s.d, SignedBytesAt(block + 32 + 32 * j));
    *w1 = Mul(s.d, SignedBytesAt(block + 32 + 32 * j + 16));
  }
};

struct Q5_0Format {
  using L = Q5_0Layout;
  struct Scales {
    Rows16 d;
  };
  static Scales Load(const uint8_t* /*header*/, const uint8_t* block) {
    return {HalvesAt(block + L::kD)};
  }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, Rows16* w0, Rows16* w1) {
    Ints16 lo, hi;
    FiveBitIndices(block + L::kQuants, j, &lo, &hi);
    *w0 = Mul(s.d, ToFloats(Minus(lo, 16)));
    *w1 = Mul(s.d, ToFloats(Minus(hi, 16)));
  }
};

template <typename Layout, bool kFiveBits>
struct ScaledMinFormat {
  using L = Layout;
  struct Scales {
    Rows16 d, m;
  };
  static Scales Load(const uint8_t* header, const uint8_t* block) {
    return {Mul(HalvesAt(header + L::kD), UnsignedBytesAt(block + L::kScale)),
            Mul(HalvesAt(header + L::kDmin), UnsignedBytesAt(block + L::kMin))};
  }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, Rows16* w0, Rows16* w1) {
    Ints16 lo, hi;
    if constexpr (kFiveBits) {
      FiveBitIndices(block + L::kQuants, j, &lo, &hi);
    } else {
      NibbleIndices(block + L::kQuants, j, &lo, &hi);
    }
    *w0 = MulSub(s.d, ToFloats(lo), s.m);
    *w1 = MulSub(s.d, ToFloats(hi), s.m);
  }
};

struct TwoScaleFormat {
  using L = Q6KLayout;
  struct Scales {
    Rows16 first, second;
  };
  static Scales Load(const uint8_t* header, const uint8_t* block) {
    const Rows16 d = HalvesAt(header + L::kD);
    return {Mul(d, SignedBytesAt(block + L::kScale0)), Mul(d, SignedBytesAt(block + L::kScale1))};
  }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, Rows16* w0, Rows16* w1) {
    const Rows16& scale = j < kBlockInputs / 4 ? s.first : s.second;
    Ints16 lo, hi;  // quant + 32
    SixBitIndices(block + L::kQuants, j, &lo, &hi);
    *w0 = Mul(scale, ToFloats(Minus(lo, 32)));
    *w1 = Mul(scale, ToFloats(Minus(hi, 32)));
  }
};

// IQ4_NL and IQ4_XS: the level of a nibble from the two halves of the
// 16-level table (a permute of each, chosen by the nibble's bit 3).
struct LevelsFormat {
  using L = LevelsLayout;
  struct Scales {
    Rows16 d;
    __m256 low_levels, high_levels;
  };
  static Scales Load(const uint8_t* /*header*/, const uint8_t* block) {
    static constexpr auto kLevels = [] {
      std::array<float, 16> levels{};
      for (int v = 0; v < 16; ++v) levels[v] = kIq4NlLevels[v];
      return levels;
    }();
    return {Mul(HalvesAt(block + L::kD), SignedBytesAt(block + L::kScale)),
            _mm256_loadu_ps(kLevels.data()), _mm256_loadu_ps(kLevels.data() + 8)};
  }
  static Rows16 Levels(const Scales& s, const Ints16& index) {
    Rows16 out;
    for (int h = 0; h < 2; ++h) {
      const __m256 high = _mm256_castsi256_ps(_mm256_slli_epi32(index.h[h], 28));
      out.h[h] = _mm256_blendv_ps(_mm256_permutevar8x32_ps(s.low_levels, index.h[h]),
                                  _mm256_permutevar8x32_ps(s.high_levels, index.h[h]), high);
    }
    return out;
  }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, Rows16* w0, Rows16* w1) {
    Ints16 lo, hi;
    NibbleIndices(block + L::kQuants, j, &lo, &hi);
    *w0 = Mul(s.d, Levels(s, lo));
    *w1 = Mul(s.d, Levels(s, hi));
  }
};

struct HalfFormat {
  using L = HalfLayout;
  struct Scales {};
  static Scales Load(const uint8_t* /*header*/, const uint8_t* /*block*/) { return {}; }
  static void DecodePair(const uint8_t* block, const Scales& /*s*/, int j, Rows16* w0, Rows16* w1) {
    *w0 = HalvesAt(block + 64 * j);
    *w1 = HalvesAt(block + 64 * j + 32);
  }
};

struct Bf16PairFormat {
  using L = HalfLayout;
  struct Scales {};
  static Scales Load(const uint8_t* /*header*/, const uint8_t* /*block*/) { return {}; }
  static void DecodePair(const uint8_t* block, const Scales& /*s*/, int j, Rows16* w0, Rows16* w1) {
    const auto* group = reinterpret_cast<const __m256i*>(block + 64 * j);
    for (int h = 0; h < 2; ++h) {
      const __m256i pair = _mm256_loadu_si256(group + h);
      w0->h[h] = _mm256_castsi256_ps(_mm256_slli_epi32(pair, 16));
      w1->h[h] = _mm256_castsi256_ps(_mm256_and_si256(pair, _mm256_set1_epi32(-65536)));
    }
  }
};

// out rows [row0, row0 + R) x the panel at n: decodes each block as it goes;
// `first` says whether this is the first tile of rows over the panel (the
// one that reads it from memory, and prefetches). Every loop over the sums
// is unrolled by Unroll, so their indices are constants from the start and
// GCC keeps them in registers (with plain loops it stored them back to the
// stack at every input).
template <typename F, int R>
void OnTheFlyTile(const uint8_t* panel, int64_t panel_bytes, int64_t blocks, const Matrix& x,
                  int64_t row0, bool first, const Matrix& out, int64_t n, const float* bias) {
  __m256 acc[R][2];  // [row][8-lane half of the panel]
  Unroll<0, R>([&](auto r) { acc[r][0] = acc[r][1] = _mm256_setzero_ps(); });
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = panel + BlockOffset<typename F::L>(b);
    const typename F::Scales scales = F::Load(panel + HeaderOffset<typename F::L>(b), block);
    if (first) PrefetchAhead<typename F::L, 1>(panel, panel_bytes, 0, b);
    Unroll<0, kBlockInputs / 2>([&](auto j) {
      Rows16 w0, w1;
      F::DecodePair(block, scales, j, &w0, &w1);
      Unroll<0, R>([&](auto r) {
        const float* xr = x.Row(row0 + r) + b * kBlockInputs + 2 * j;
        const __m256 x0 = _mm256_broadcast_ss(xr);
        Unroll<0, 2>([&](auto h) { acc[r][h] = _mm256_fmadd_ps(x0, w0.h[h], acc[r][h]); });
        const __m256 x1 = _mm256_broadcast_ss(xr + 1);
        Unroll<0, 2>([&](auto h) { acc[r][h] = _mm256_fmadd_ps(x1, w1.h[h], acc[r][h]); });
      });
    });
  }
  Unroll<0, R>([&](auto r) {
    float* o = out.Row(row0 + r) + n;
    Unroll<0, 2>([&](auto h) {
      __m256 sum = acc[r][h];
      if (bias != nullptr) sum = _mm256_add_ps(sum, _mm256_loadu_ps(bias + n + 8 * h));
      _mm256_storeu_ps(o + 8 * h, sum);
    });
  });
}

// dst[k][16] = the weights of input k for the panel's 16 rows, in order.
template <typename F>
void DequantizePanel(const uint8_t* panel, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = panel + BlockOffset<typename F::L>(b);
    const typename F::Scales scales = F::Load(panel + HeaderOffset<typename F::L>(b), block);
    for (int j = 0; j < kBlockInputs / 2; ++j) {
      Rows16 w0, w1;
      F::DecodePair(block, scales, j, &w0, &w1);
      float* d = dst + (b * kBlockInputs + 2 * j) * kPanelWidth;
      for (int h = 0; h < 2; ++h) {
        _mm256_storeu_ps(d + 8 * h, w0.h[h]);
        _mm256_storeu_ps(d + kPanelWidth + 8 * h, w1.h[h]);
      }
    }
  }
}

// out rows [row0, row0 + R) x the panel at n, from its dequantized weights.
// (The loops over rows are unrolled by Unroll, so every index of the sums
// is a constant from the start and GCC keeps them in registers; with plain
// loops it stored them back to the stack at every input.)
template <int R>
void GemmTile(const float* weights, int64_t inputs, const Matrix& x, int64_t row0,
              const Matrix& out, int64_t n, const float* bias) {
  __m256 low[R], high[R];
  const float* xr[R];
  Unroll<0, R>([&](auto r) {
    low[r] = high[r] = _mm256_setzero_ps();
    xr[r] = x.Row(row0 + r);
  });
  for (int64_t k = 0; k < inputs; ++k) {
    const __m256 w0 = _mm256_loadu_ps(weights + k * kPanelWidth);
    const __m256 w1 = _mm256_loadu_ps(weights + k * kPanelWidth + 8);
    Unroll<0, R>([&](auto r) {
      const __m256 xk = _mm256_broadcast_ss(xr[r] + k);
      low[r] = _mm256_fmadd_ps(xk, w0, low[r]);
      high[r] = _mm256_fmadd_ps(xk, w1, high[r]);
    });
  }
  Unroll<0, R>([&](auto r) {
    float* o = out.Row(row0 + r) + n;
    if (bias != nullptr) {
      low[r] = _mm256_add_ps(low[r], _mm256_loadu_ps(bias + n));
      high[r] = _mm256_add_ps(high[r], _mm256_loadu_ps(bias + n + 8));
    }
    _mm256_storeu_ps(o, low[r]);
    _mm256_storeu_ps(o + 8, high[r]);
  });
}

template <typename F>
void PackedRows(const PackedWeight& weight, const Matrix& x, int64_t n0, int64_t n1,
                const float* bias, std::vector<float>& scratch, const Matrix& out) {
  const int64_t blocks = weight.cols / kBlockInputs;
  const uint8_t* base = weight.data.get();
  auto panel_at = [&](int64_t n) { return base + n / kPanelWidth * weight.panel_bytes; };
  if (x.rows <= kOnTheFlyMaxRows) {
    for (int64_t n = n0; n < n1; n += kPanelWidth) {
      for (int64_t row0 = 0; row0 < x.rows; row0 += kOnTheFlyRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kOnTheFlyRows, x.rows - row0));
        WithConstant<kOnTheFlyRows>(rows, [&](auto r) {
          OnTheFlyTile<F, r()>(panel_at(n), weight.panel_bytes, blocks, x, row0, row0 == 0, out, n,
                               bias);
        });
      }
    }
    return;
  }
  scratch.resize(static_cast<size_t>(weight.cols * kPanelWidth));
  for (int64_t n = n0; n < n1; n += kPanelWidth) {
    DequantizePanel<F>(panel_at(n), blocks, scratch.data());
    for (int64_t r0 = 0; r0 < x.rows; r0 += kGemmRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kGemmRows, x.rows - r0));
      WithConstant<kGemmRows>(
          rows, [&](auto r) { GemmTile<r()>(scratch.data(), weight.cols, x, r0, out, n, bias); });
    }
  }
}

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

void MatMulPackedRows(const PackedWeight& weight, const Matrix& x, int64_t n0, int64_t n1,
                      const float* bias, std::vector<float>& scratch, const Matrix& out) {
  WithFormat(weight.dtype,
             [&](auto f) { PackedRows<decltype(f)>(weight, x, n0, n1, bias, scratch, out); });
}

}  // namespace tandem::kernels::cpu
#endif  // TANDEM_CPU_AVX2 && !TANDEM_CPU_AVX512
