// The bfloat16-activation products over packed panels (packed_matmul.h).
#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>
#include <utility>

#include "common/check.h"
#include "engine/kernels/cpu/matmul_tiling.h"
#include "engine/kernels/cpu/packed_decode.h"
#include "engine/kernels/cpu/packed_matmul.h"
#include "engine/kernels/cpu/simd.h"

namespace tandem::kernels::cpu {

#if defined(TANDEM_CPU_AVX512) && defined(__AVX512BF16__)
namespace {

constexpr int64_t kBlockInputs = 32;
constexpr int kPairs = kBlockInputs / 2;
// Up to this many activation rows (a decode step, a verification of drafted
// tokens, a short prompt chunk) each block is decoded inside the product, in
// tiles of up to 8 rows x 2 panels (4 panels for 1-2 rows; matmul_tiling.h),
// the later tiles of rows reading the panels from cache. Above, each pair
// of panels is decoded into scratch once. Measured with
// `tandem-matmul-bench` (2 threads, 2026-12-05): decoding on the fly takes
// 0.65-0.85x the scratch kernel's time at 8-16 rows, the same at 24-32, and
// 1.1x (SmolLM2's shapes) to 1.4-1.5x (a 1B model's, whose panels outgrow
// L1) at 48-64. Since plain nibbles decode by a shift and one vpternlogd a
// pair (BiasedQuants), Q4_K takes 0.89-0.96x the scratch kernel's time at
// 48-64 rows (2026-12-06, 4 layers of the 1B shape; Q4_0 and Q4_1 decode
// alike), so they switch above 64; Q5_K is even there, Q6_K, IQ4_XS and
// Q8_0 1.1-1.3x.
constexpr int64_t kOnTheFlyMaxRows = 32;
constexpr int64_t kNibblesOnTheFlyMaxRows = 64;
// The scratch kernel's tile: 8 rows x 2 panels of block-local sums in
// registers (16), their running totals in an L1 array.
constexpr int kGemmRows = 8;
constexpr int kGemmPanels = 2;

// The bfloat16 bits of a small integer (exact: at most 8 significant bits).
constexpr uint16_t Bf16Of(int v) {
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(v)) >> 16);
}

// IQ4_NL and IQ4_XS level index -> bfloat16(level) (exact: at most 7
// significant bits), in the low 16 of 32 words.
inline __m512i LevelTable() {
  alignas(64) uint16_t words[32] = {};
  for (int v = 0; v < 16; ++v) words[v] = Bf16Of(kIq4NlLevels[v]);
  return _mm512_load_si512(words);
}

// Nibble and five-bit quants q enter the products as bfloat16(kQuantBias +
// q): 0x4300 | q, exact for q < 128 (bfloat16(128) = 0x4300, and its seven
// significand bits hold q). Making them takes one OR where a table lookup
// would take a permute; the block's minimum term takes the bias back
// (M gains -kQuantBias * D), so it costs no operation per input.
constexpr int kQuantBias = 128;

// Pair k of a nibble group (packed_matmul.h) as 16-bit integers 0-15, row
// i's in lane i, input 2j in the low word (j = 4g + k).
template <int k>
inline __m512i GroupPair(__m512i group) {
  if constexpr (k == 0) return group;
  return _mm512_srli_epi32(group, 4 * k);
}
template <int k>
inline __m512i PairNibbles(__m512i group) {
  return _mm512_and_si512(GroupPair<k>(group), _mm512_set1_epi32(0x000f000f));
}
// The same as bfloat16(kQuantBias + q) pairs: (pair & 0x000f000f) | 0x43004300.
template <int k>
inline __m512i BiasedNibblePair(__m512i group) {
  static_assert(kQuantBias == 128);
  return _mm512_ternarylogic_epi32(GroupPair<k>(group), _mm512_set1_epi32(0x000f000f),
                                   _mm512_set1_epi32(0x43004300), 0xea);
}
// Adds 16 (and 32) to the 16-bit quants (or their bfloat16s, whose bits 4
// and 5 are clear) of pair j where the top-bit words after the nibbles at
// `quants` mark them.
template <int kTopBits>
inline __m512i AddTopBits(__m512i pair, const uint8_t* quants, int j) {
  for (int bit = 0; bit < kTopBits; ++bit) {
    const __mmask32 marked = TopBitWord(quants + kFifthBitsOffset + 64 * bit, j);
    pair =
        _mm512_mask_add_epi16(pair, marked, pair, _mm512_set1_epi16(static_cast<short>(16 << bit)));
  }
  return pair;
}

// Two vectors of small integers (exact in bfloat16) as one of bfloat16
// pairs, q0's in the low halves: as floats they are exact, so their top
// halves are their bfloat16s.
inline __m512i Bf16PairOf(__m512i q0, __m512i q1) {
  const __m512i a = _mm512_castps_si512(_mm512_cvtepi32_ps(q0));
  const __m512i b = _mm512_castps_si512(_mm512_cvtepi32_ps(q1));
  // (a >> 16) | (b & 0xffff0000)
  return _mm512_ternarylogic_epi32(_mm512_srli_epi32(a, 16), b, _mm512_set1_epi32(-65536), 0xf8);
}

// Quants stored as bytes, group j (16 bytes) = input j of the 16 rows.
template <int64_t kQuants>
inline __m512i DecodeBytePair(const uint8_t* block, int j) {
  const uint8_t* q = block + kQuants + 32 * j;
  return Bf16PairOf(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))),
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))));
}

// Per packed format: Group(block, g) loads what pairs 4g..4g+3 decode from
// (a nibble group; nothing for bytes and BF16), and Pair<k>(group, block, j,
// table) gives the quants (or their biased form) of inputs 2j and 2j + 1 for
// the panel's 16 rows as one vector of bfloat16 pairs (lane i = row i; its
// low half is input 2j; j = 4g + k); D(header, block, sub) is the block's
// scale for each of its kSubBlocks runs of inputs (32 or 16 inputs each);
// kHasMin says whether it has a minimum term, and M its coefficient (of the
// block's activation sum).

// Nibbles at kQuants, as bfloat16(kQuantBias + q), plus the fifth bits for
// kTopBits 1.
template <int64_t kQuants, int kTopBits>
struct BiasedQuants {
  static constexpr int64_t kMaxOnTheFlyRows =
      kTopBits == 0 ? kNibblesOnTheFlyMaxRows : kOnTheFlyMaxRows;
  static __m512i Table() { return _mm512_setzero_si512(); }
  static __m512i Group(const uint8_t* block, int g) {
    return _mm512_loadu_si512(block + kQuants + 64 * g);
  }
  template <int k>
  static __m512i Pair(__m512i group, const uint8_t* block, int j, __m512i /*table*/) {
    return AddTopBits<kTopBits>(BiasedNibblePair<k>(group), block + kQuants, j);
  }
};

// Q4_0, Q4_1, Q5_0 and Q8_0: one half scale d (then, for Q4_1, the half
// minimum m) per row at the block's start.
struct OneHalfScale {
  static constexpr int kSubBlocks = 1;
  static __m512 D(const uint8_t* /*header*/, const uint8_t* block, int /*sub*/) {
    return HalvesAt(block);
  }
};

// w = d * q + m; M = m - kQuantBias * d.
struct Q4_1Bf16 : OneHalfScale, BiasedQuants<64, 0> {
  using L = PlainLayout<32 + 32 + 256>;
  static constexpr bool kHasMin = true;
  static __m512 M(const uint8_t* /*header*/, const uint8_t* block) {
    return _mm512_fnmadd_ps(HalvesAt(block), _mm512_set1_ps(kQuantBias), HalvesAt(block + 32));
  }
};

// w = d * (q - 8); M = -(kQuantBias + 8) * d (exact).
struct Q4_0Bf16 : OneHalfScale, BiasedQuants<32, 0> {
  using L = PlainLayout<32 + 256>;
  static constexpr bool kHasMin = true;
  static __m512 M(const uint8_t* /*header*/, const uint8_t* block) {
    return _mm512_mul_ps(HalvesAt(block), _mm512_set1_ps(-(kQuantBias + 8)));
  }
};

// Q5_0: w = d * (q - 16), as the Q8_0 block it widens to elsewhere; M =
// -(kQuantBias + 16) * d (exact).
struct Q5_0Bf16 : OneHalfScale, BiasedQuants<Q5_0Layout::kQuants, 1> {
  using L = Q5_0Layout;
  static constexpr bool kHasMin = true;
  static __m512 M(const uint8_t* /*header*/, const uint8_t* block) {
    return _mm512_mul_ps(D(nullptr, block, 0), _mm512_set1_ps(-(kQuantBias + 16)));
  }
};

// Whole bytes (Q8_0): v = the signed byte, no bias.
struct Q8_0Bf16 : OneHalfScale {
  static constexpr int64_t kMaxOnTheFlyRows = kOnTheFlyMaxRows;
  using L = PlainLayout<32 + 512>;
  static constexpr bool kHasMin = false;
  static __m512i Table() { return _mm512_setzero_si512(); }
  static __m512i Group(const uint8_t* /*block*/, int /*g*/) { return _mm512_setzero_si512(); }
  template <int k>
  static __m512i Pair(__m512i /*group*/, const uint8_t* block, int j, __m512i /*table*/) {
    return DecodeBytePair<32>(block, j);
  }
  static __m512 M(const uint8_t*, const uint8_t*) { return _mm512_setzero_ps(); }
};

// Q4_K (Q4KLayout, nibbles), Q5_K (Q5KLayout) and Q5_1 (ScaledMinLayout),
// five bits: w = D * q - dmin * min with D = d * scale (exact); M =
// -(dmin * min) - kQuantBias * D (one rounding).
template <typename Layout, bool kFiveBits>
struct ScaledMinBf16 : BiasedQuants<Layout::kQuants, kFiveBits ? 1 : 0> {
  using L = Layout;
  static constexpr bool kHasMin = true;
  static constexpr int kSubBlocks = 1;
  static __m512 D(const uint8_t* header, const uint8_t* block, int /*sub*/) {
    return _mm512_mul_ps(HalvesAt(header + L::kD), SignedBytesAt(block + L::kScale));
  }
  static __m512 M(const uint8_t* header, const uint8_t* block) {
    const __m512 min_term =
        _mm512_mul_ps(_mm512_mul_ps(HalvesAt(header + L::kDmin), SignedBytesAt(block + L::kMin)),
                      _mm512_set1_ps(-1.0f));
    return _mm512_fnmadd_ps(D(header, block, 0), _mm512_set1_ps(kQuantBias), min_term);
  }
};

// Q6_K (Q6KLayout): D of inputs 0-15 and of 16-31, no minimum; the stored
// quants u (quant + 32) are looked up in a table of bfloat16(u - 32).
struct TwoScaleBf16 {
  static constexpr int64_t kMaxOnTheFlyRows = kOnTheFlyMaxRows;
  using L = Q6KLayout;
  static constexpr bool kHasMin = false;
  static constexpr int kSubBlocks = 2;
  // u -> bfloat16(u - 32): 0-31 in `low`, 32-63 in `high`.
  struct Tables {
    __m512i low, high;
  };
  static Tables Table() {
    alignas(64) uint16_t words[64];
    for (int u = 0; u < 64; ++u) words[u] = Bf16Of(u - 32);
    return {_mm512_load_si512(words), _mm512_load_si512(words + 32)};
  }
  static __m512i Group(const uint8_t* block, int g) {
    return _mm512_loadu_si512(block + L::kQuants + 64 * g);
  }
  template <int k>
  static __m512i Pair(__m512i group, const uint8_t* block, int j, const Tables& t) {
    return _mm512_permutex2var_epi16(
        t.low, AddTopBits<2>(PairNibbles<k>(group), block + L::kQuants, j), t.high);
  }
  static __m512 D(const uint8_t* header, const uint8_t* block, int sub) {
    return _mm512_mul_ps(HalvesAt(header + L::kD),
                         SignedBytesAt(block + (sub == 0 ? L::kScale0 : L::kScale1)));
  }
  static __m512 M(const uint8_t*, const uint8_t*) { return _mm512_setzero_ps(); }
};

// IQ4_NL and IQ4_XS (LevelsLayout): D = d * scale, the levels from a table
// by their nibble index.
struct LevelsBf16 {
  static constexpr int64_t kMaxOnTheFlyRows = kOnTheFlyMaxRows;
  using L = LevelsLayout;
  static constexpr bool kHasMin = false;
  static constexpr int kSubBlocks = 1;
  static __m512i Table() { return LevelTable(); }
  static __m512i Group(const uint8_t* block, int g) {
    return _mm512_loadu_si512(block + L::kQuants + 64 * g);
  }
  template <int k>
  static __m512i Pair(__m512i group, const uint8_t* /*block*/, int /*j*/, __m512i table) {
    return _mm512_permutexvar_epi16(PairNibbles<k>(group), table);
  }
  static __m512 D(const uint8_t* /*header*/, const uint8_t* block, int /*sub*/) {
    return _mm512_mul_ps(HalvesAt(block + L::kD), SignedBytesAt(block + L::kScale));
  }
  static __m512 M(const uint8_t*, const uint8_t*) { return _mm512_setzero_ps(); }
};

// BF16 weights (HalfLayout, in pairs): the stored pairs themselves, D = 1.
struct Bf16WeightsBf16 {
  static constexpr int64_t kMaxOnTheFlyRows = kOnTheFlyMaxRows;
  using L = HalfLayout;
  static constexpr bool kHasMin = false;
  static constexpr int kSubBlocks = 1;
  static __m512i Table() { return _mm512_setzero_si512(); }
  static __m512i Group(const uint8_t* /*block*/, int /*g*/) { return _mm512_setzero_si512(); }
  template <int k>
  static __m512i Pair(__m512i /*group*/, const uint8_t* block, int j, __m512i /*table*/) {
    return _mm512_loadu_si512(block + 64 * j);
  }
  static __m512 D(const uint8_t* /*header*/, const uint8_t* /*block*/, int /*sub*/) {
    return _mm512_set1_ps(1.0f);
  }
  static __m512 M(const uint8_t*, const uint8_t*) { return _mm512_setzero_ps(); }
};

// Pairs of inputs in a nibble group (NibbleAt): one load, four constant shifts.
constexpr int kPairsPerGroup = 4;

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

// A block is folded into the totals in the same order in both kernels: for
// each run of inputs, acc = fma(D, inner, acc) with inner the run's dot
// product; then, with a minimum, acc = fma(M, block sum of x, acc).
template <typename F>
constexpr int PairsPerSubBlock() {
  return kPairs / F::kSubBlocks;
}
template <typename F>
constexpr int GroupsPerSubBlock() {
  return PairsPerSubBlock<F>() / kPairsPerGroup;
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

// out rows [row0, row0 + R) x panels [n, n + 16P), decoding each block as it
// goes; `first` says whether this is the first tile of rows over these
// panels (the one that reads them from memory, and prefetches).
template <typename F, int R, int P>
void OnTheFlyTile(const uint8_t* panel, int64_t panel_bytes, int64_t blocks, const uint16_t* xb,
                  const float* sums, int64_t cols, int64_t row0, bool first, const Matrix& out,
                  int64_t n, const float* bias) {
  xb += row0 * cols;
  sums += row0 * blocks;
  const auto table = F::Table();
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block[P];
    const uint8_t* header[P];
    for (int p = 0; p < P; ++p) {
      header[p] = panel + p * panel_bytes + HeaderOffset<typename F::L>(b);
      block[p] = panel + p * panel_bytes + BlockOffset<typename F::L>(b);
      if (first) PrefetchAhead<typename F::L, P>(panel, panel_bytes, p, b);
    }
    for (int sub = 0; sub < F::kSubBlocks; ++sub) {
      __m512 inner[R][P];
      for (int r = 0; r < R; ++r) {
        for (int p = 0; p < P; ++p) inner[r][p] = _mm512_setzero_ps();
      }
      for (int g = sub * GroupsPerSubBlock<F>(); g < (sub + 1) * GroupsPerSubBlock<F>(); ++g) {
        __m512i group[P];
        for (int p = 0; p < P; ++p) group[p] = F::Group(block[p], g);
        Unroll<0, kPairsPerGroup>([&](auto k) {
          const int j = kPairsPerGroup * g + k();
          __m512i w[P];
          for (int p = 0; p < P; ++p) w[p] = F::template Pair<k()>(group[p], block[p], j, table);
          for (int r = 0; r < R; ++r) {
            const __m512i x = XPair(xb + r * cols, b, j);
            for (int p = 0; p < P; ++p) inner[r][p] = Dot(inner[r][p], x, w[p]);
          }
        });
      }
      for (int p = 0; p < P; ++p) {
        const __m512 d = F::D(header[p], block[p], sub);
        for (int r = 0; r < R; ++r) acc[r][p] = _mm512_fmadd_ps(d, inner[r][p], acc[r][p]);
      }
    }
    if constexpr (F::kHasMin) {
      for (int p = 0; p < P; ++p) {
        const __m512 m = F::M(header[p], block[p]);
        for (int r = 0; r < R; ++r) {
          acc[r][p] = _mm512_fmadd_ps(m, _mm512_set1_ps(sums[r * blocks + b]), acc[r][p]);
        }
      }
    }
  }
  float totals[R][P][16];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(totals[r][p], acc[r][p]);
  }
  Store<R, P>(totals, out, row0, n, bias);
}

// Scratch for P panels: per block, the 16 pair vectors of each panel, then
// each panel's D of sub-block 0, D of sub-block 1 and M as floats.
template <int P>
constexpr int64_t ScratchFloatsPerBlock() {
  return int64_t{kPairs} * P * 16 + 3 * P * 16;
}

template <typename F, int P>
void DecodePanels(const uint8_t* panel, int64_t panel_bytes, int64_t blocks, float* scratch) {
  const auto table = F::Table();
  for (int64_t b = 0; b < blocks; ++b) {
    float* dst = scratch + b * ScratchFloatsPerBlock<P>();
    for (int p = 0; p < P; ++p) {
      const uint8_t* header = panel + p * panel_bytes + HeaderOffset<typename F::L>(b);
      const uint8_t* block = panel + p * panel_bytes + BlockOffset<typename F::L>(b);
      for (int g = 0; g < kPairs / kPairsPerGroup; ++g) {
        const __m512i group = F::Group(block, g);
        Unroll<0, kPairsPerGroup>([&](auto k) {
          const int j = kPairsPerGroup * g + k();
          _mm512_storeu_si512(dst + (j * P + p) * 16,
                              F::template Pair<k()>(group, block, j, table));
        });
      }
      float* scales = dst + kPairs * P * 16;
      for (int sub = 0; sub < F::kSubBlocks; ++sub) {
        _mm512_storeu_ps(scales + (sub * P + p) * 16, F::D(header, block, sub));
      }
      if constexpr (F::kHasMin) _mm512_storeu_ps(scales + (2 * P + p) * 16, F::M(header, block));
    }
  }
}

template <typename F, int R, int P>
void GemmTile(const float* scratch, int64_t blocks, const uint16_t* xb, const float* sums,
              int64_t cols, int64_t row0, const Matrix& out, int64_t n, const float* bias) {
  float totals[R][P][16] = {};
  for (int64_t b = 0; b < blocks; ++b) {
    const float* src = scratch + b * ScratchFloatsPerBlock<P>();
    const float* scales = src + kPairs * P * 16;
    for (int sub = 0; sub < F::kSubBlocks; ++sub) {
      __m512 inner[R][P];
      for (int r = 0; r < R; ++r) {
        for (int p = 0; p < P; ++p) inner[r][p] = _mm512_setzero_ps();
      }
      for (int j = sub * PairsPerSubBlock<F>(); j < (sub + 1) * PairsPerSubBlock<F>(); ++j) {
        __m512i w[P];
        for (int p = 0; p < P; ++p) w[p] = _mm512_loadu_si512(src + (j * P + p) * 16);
        for (int r = 0; r < R; ++r) {
          const __m512i x = XPair(xb + (row0 + r) * cols, b, j);
          for (int p = 0; p < P; ++p) inner[r][p] = Dot(inner[r][p], x, w[p]);
        }
      }
      for (int p = 0; p < P; ++p) {
        const __m512 d = _mm512_loadu_ps(scales + (sub * P + p) * 16);
        for (int r = 0; r < R; ++r) {
          _mm512_storeu_ps(totals[r][p],
                           _mm512_fmadd_ps(d, inner[r][p], _mm512_loadu_ps(totals[r][p])));
        }
      }
    }
    if constexpr (F::kHasMin) {
      for (int p = 0; p < P; ++p) {
        const __m512 m = _mm512_loadu_ps(scales + (2 * P + p) * 16);
        for (int r = 0; r < R; ++r) {
          _mm512_storeu_ps(totals[r][p],
                           _mm512_fmadd_ps(m, _mm512_set1_ps(sums[(row0 + r) * blocks + b]),
                                           _mm512_loadu_ps(totals[r][p])));
        }
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
  if (rows <= F::kMaxOnTheFlyRows) {
    ForEachOnTheFlyTile(rows, n0, n1, [&](auto r, auto p, int64_t n, int64_t row0) {
      OnTheFlyTile<F, r(), p()>(panel_at(n), weight.panel_bytes, blocks, xb, sums, weight.cols,
                                row0, row0 == 0, out, n, bias);
    });
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
    case DType::kQ5_0:
      return Bf16Rows<Q5_0Bf16>(weight, xb, sums, rows, n0, n1, bias, scratch, out);
    case DType::kQ4_K:
      return Bf16Rows<ScaledMinBf16<Q4KLayout, false>>(weight, xb, sums, rows, n0, n1, bias,
                                                       scratch, out);
    case DType::kQ5_K:
      return Bf16Rows<ScaledMinBf16<Q5KLayout, true>>(weight, xb, sums, rows, n0, n1, bias, scratch,
                                                      out);
    case DType::kQ5_1:
      return Bf16Rows<ScaledMinBf16<ScaledMinLayout, true>>(weight, xb, sums, rows, n0, n1, bias,
                                                            scratch, out);
    case DType::kQ6_K:
      return Bf16Rows<TwoScaleBf16>(weight, xb, sums, rows, n0, n1, bias, scratch, out);
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return Bf16Rows<LevelsBf16>(weight, xb, sums, rows, n0, n1, bias, scratch, out);
    case DType::kBF16:
      return Bf16Rows<Bf16WeightsBf16>(weight, xb, sums, rows, n0, n1, bias, scratch, out);
    case DType::kF16:
      TANDEM_CHECK(false, "F16 weights have no bfloat16 panels (HasBf16Panels)");
      return;
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
