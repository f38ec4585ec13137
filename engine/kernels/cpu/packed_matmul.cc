#include "engine/kernels/cpu/packed_matmul.h"

#include <algorithm>
#include <array>

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
// The scratch kernel's register tiles: 16 accumulators, as 8 rows x 2
// panels or, for a task's last panel where its range holds an odd number,
// 16 rows x 1 panel: 16 independent chains keep both FMA ports busy through
// the FMA's latency, where 8 rows x 1 panel (8 chains) leaves them idle part
// of the time.
constexpr int kGemmPanels = 2;
constexpr int GemmRows(int panels) { return panels == 1 ? 16 : 8; }

// Per packed format: its layout L (packed_matmul.h), the scale loads of a
// block (from the block and its header) and the decoding of inputs 2j and
// 2j + 1 of a block for the panel's 16 rows, giving DequantizeRow's weights
// bit for bit. Where DequantizeRow multiplies and then adds (Q4_1: d * q + m;
// the Block32 types with a minimum: (d * scale) * q - dmin * min), the
// decoding fuses the two into one FMA: the product of a half (11 significant
// bits), a 6-bit scale (1 for Q5_1's blocks) and a quant of at most 5 bits
// has at most 22, so it is exact in float32, and the FMA's one rounding is
// the add's. On the one-row products of decode steps, which issue these
// instructions for every weight and little else, that is one instruction in
// six.
struct Q4_1Format {
  using L = Q4_1Layout;
  struct Scales {
    __m512 d, m;
  };
  static Scales Load(const uint8_t* /*header*/, const uint8_t* block) {
    return {HalvesAt(block), HalvesAt(block + 32)};
  }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, __m512* w0, __m512* w1) {
    __m512 lo, hi;
    NibbleLevels(block + 64, j, Levels(0), &lo, &hi);
    *w0 = _mm512_fmadd_ps(s.d, lo, s.m);
    *w1 = _mm512_fmadd_ps(s.d, hi, s.m);
  }
};

struct Q4_0Format {
  using L = Q4_0Layout;
  struct Scales {
    __m512 d;
  };
  static Scales Load(const uint8_t* /*header*/, const uint8_t* block) { return {HalvesAt(block)}; }
  static void DecodePair(const uint8_t* block, const Scales& s, int j, __m512* w0, __m512* w1) {
    __m512 lo, hi;  // quant - 8
    NibbleLevels(block + 32, j, Levels(-8), &lo, &hi);
    *w0 = _mm512_mul_ps(s.d, lo);
    *w1 = _mm512_mul_ps(s.d, hi);
  }
};

struct Q8_0Format {
  using L = Q8_0Layout;
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
    __m512 lo, hi;  // quant - 16
    FiveBitLevels(block + L::kQuants, j, 16, &lo, &hi);
    *w0 = _mm512_mul_ps(s.d, lo);
    *w1 = _mm512_mul_ps(s.d, hi);
  }
};

// Block32 types (block32.h) with a minimum: Q4_K (Q4KLayout, nibbles), Q5_K
// (Q5KLayout) and Q5_1 (ScaledMinLayout), five bits. w = (d * scale) * q -
// dmin * min, as DequantizeRow, in one FMA (every product is exact, so it is
// DequantizeRow's weight bit for bit).
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
    __m512 lo, hi;
    if constexpr (kFiveBits) {
      FiveBitLevels(block + L::kQuants, j, 0, &lo, &hi);
    } else {
      NibbleLevels(block + L::kQuants, j, Levels(0), &lo, &hi);
    }
    *w0 = _mm512_fmsub_ps(s.d, lo, s.m);
    *w1 = _mm512_fmsub_ps(s.d, hi, s.m);
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
    __m512 lo, hi;  // the stored quant (quant + 32) less 32
    SixBitLevels(block + L::kQuants, j, 32, &lo, &hi);
    *w0 = _mm512_mul_ps(scale, lo);
    *w1 = _mm512_mul_ps(scale, hi);
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
    __m512 lo, hi;
    NibbleLevels(block + L::kQuants, j, s.levels, &lo, &hi);
    *w0 = _mm512_mul_ps(s.d, lo);
    *w1 = _mm512_mul_ps(s.d, hi);
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
      constexpr int kRows = GemmRows(p());
      DequantizePanels<F, p()>(panel_at(n), weight.panel_bytes, blocks, scratch.data());
      for (int64_t r0 = 0; r0 < x.rows; r0 += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, x.rows - r0));
        WithConstant<kRows>(rows, [&](auto r) {
          GemmTile<r(), p()>(scratch.data(), weight.cols, x, r0, out, n, bias);
        });
      }
    });
    n += panels * kPanelWidth;
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

void MatMulPackedRows(const PackedWeight& weight, const Matrix& x, int64_t n0, int64_t n1,
                      const float* bias, std::vector<float>& scratch, const Matrix& out) {
  WithFormat(weight.dtype,
             [&](auto f) { PackedRows<decltype(f)>(weight, x, n0, n1, bias, scratch, out); });
}

#elif !defined(TANDEM_CPU_AVX2)  // nothing is packed (CanPackWeight is
                                 // false), so nothing calls this.

void MatMulPackedRows(const PackedWeight&, const Matrix&, int64_t, int64_t, const float*,
                      std::vector<float>&, const Matrix&) {}

#endif  // TANDEM_CPU_AVX512, else !TANDEM_CPU_AVX2

}  // namespace tandem::kernels::cpu
