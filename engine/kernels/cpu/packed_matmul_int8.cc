// The 8-bit-activation products over integer panels (packed_matmul_int8.h).
#include "engine/kernels/cpu/packed_matmul_int8.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "engine/kernels/cpu/block32.h"
#include "engine/kernels/cpu/matmul_tiling.h"
#include "engine/kernels/cpu/packed_decode.h"
#include "engine/kernels/cpu/simd.h"

namespace tandem::kernels::cpu {

#if defined(TANDEM_CPU_AVX512) && defined(__AVX512VNNI__)
namespace {

constexpr int64_t kBlockInputs = 32;
constexpr int64_t kVectorBytes = 64;

// The integer panels keep the float panels' layouts (packed_matmul.h): the
// headers and scales where they are, and quants of the same room rewritten
// in their own order (WriteIntegerQuants).

// Per format: its layout L, the float panels' own (the same headers, scales
// at the same offsets and block sizes; only the quants from kQuants on are
// rewritten, in place); whether the float panels hold nibbles (NibbleAt),
// and fifth (and sixth) bits after them, or bytes (SrcByte: where row i's
// quant of input e is); the bias of the stored quants;
// their top bits beyond a nibble (0: nibbles, 4: whole bytes); the runs of inputs that share a
// scale; the scale D of run r and the minimum's coefficient M, as the float kernels read them
// (exact products).
struct NibbleSource {
  static constexpr bool kSrcNibbles = true;
  static constexpr int kSrcTopBits = 0;
};
struct FiveBitSource : NibbleSource {
  static constexpr int kSrcTopBits = 1;
};
struct SixBitSource : NibbleSource {
  static constexpr int kSrcTopBits = 2;
};
struct ByteSource {
  static constexpr bool kSrcNibbles = false;
  static constexpr int64_t SrcByte(int e, int i) { return 16 * e + i; }
};

// Q4_0, Q5_0 and Q8_0: a half scale d at the block's start, D = d, no
// minimum. Q5_0 stores the file's five-bit q (its value + 16): less the bias,
// the same integer products and scaling as the Q8_0 block it widens to where
// it has no panels of its own.
template <typename Layout, typename Source, int kStoredBias, int kTop>
struct OneScaleInt8 : Source {
  using L = Layout;
  static constexpr int64_t kQuants = 32;
  static constexpr int kBias = kStoredBias, kTopBits = kTop, kRuns = 1;
  static constexpr bool kHasMin = false, kLevels = false;
  static __m512 D(const uint8_t*, const uint8_t* block, int) { return HalvesAt(block); }
  static __m512 M(const uint8_t*, const uint8_t*) { return _mm512_setzero_ps(); }
};
using Q4_0Int8 = OneScaleInt8<PlainLayout<32 + 256>, NibbleSource, 8, 0>;
using Q5_0Int8 = OneScaleInt8<Q5_0Layout, FiveBitSource, 16, 1>;
using Q8_0Int8 = OneScaleInt8<PlainLayout<32 + 512>, ByteSource, 128, 4>;

struct Q4_1Int8 : NibbleSource {
  using L = PlainLayout<32 + 32 + 256>;
  static constexpr int64_t kQuants = 64;
  static constexpr int kBias = 0, kTopBits = 0, kRuns = 1;
  static constexpr bool kHasMin = true, kLevels = false;
  static __m512 D(const uint8_t*, const uint8_t* block, int) { return HalvesAt(block); }
  static __m512 M(const uint8_t*, const uint8_t* block) { return HalvesAt(block + 32); }
};

// Q4_K (nibbles), Q5_K and Q5_1 (a nibble and a top bit): D = d * scale,
// M = -(dmin * min).
template <typename Layout, typename Source, int kTop>
struct ScaledMinInt8 : Source {
  using L = Layout;
  static constexpr int64_t kQuants = L::kQuants;
  static constexpr int kBias = 0, kTopBits = kTop, kRuns = 1;
  static constexpr bool kHasMin = true, kLevels = false;
  static __m512 D(const uint8_t* header, const uint8_t* block, int) {
    return _mm512_mul_ps(HalvesAt(header + L::kD), UnsignedBytesAt(block + L::kScale));
  }
  static __m512 M(const uint8_t* header, const uint8_t* block) {
    return _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(HalvesAt(header + L::kDmin),
                                                            UnsignedBytesAt(block + L::kMin)));
  }
};
using Q4KInt8 = ScaledMinInt8<Q4KLayout, NibbleSource, 0>;
using Q5KInt8 = ScaledMinInt8<Q5KLayout, FiveBitSource, 1>;
using Q5_1Int8 = ScaledMinInt8<ScaledMinLayout, FiveBitSource, 1>;

// Q6_K: a nibble and two top bits, two runs of 16 inputs, D = d * scale of
// the run.
struct Q6KInt8 : SixBitSource {
  using L = Q6KLayout;
  static constexpr int64_t kQuants = L::kQuants;
  static constexpr int kBias = 32, kTopBits = 2, kRuns = 2;
  static constexpr bool kHasMin = false, kLevels = false;
  static __m512 D(const uint8_t* header, const uint8_t* block, int run) {
    return _mm512_mul_ps(HalvesAt(header + L::kD),
                         SignedBytesAt(block + (run == 0 ? L::kScale0 : L::kScale1)));
  }
  static __m512 M(const uint8_t*, const uint8_t*) { return _mm512_setzero_ps(); }
};

// IQ4_NL and IQ4_XS: level indices, D = d * scale.
struct LevelsInt8 : NibbleSource {
  using L = LevelsLayout;
  static constexpr int64_t kQuants = L::kQuants;
  static constexpr int kBias = 128, kTopBits = 0, kRuns = 1;
  static constexpr bool kHasMin = false, kLevels = true;
  static __m512 D(const uint8_t*, const uint8_t* block, int) {
    return _mm512_mul_ps(HalvesAt(block + L::kD), SignedBytesAt(block + L::kScale));
  }
  static __m512 M(const uint8_t*, const uint8_t*) { return _mm512_setzero_ps(); }
};

// Level index -> level + 128, in every 16-byte lane (for vpshufb).
inline __m512i LevelBytes() {
  alignas(16) uint8_t bytes[16];
  for (int v = 0; v < 16; ++v) bytes[v] = static_cast<uint8_t>(kIq4NlLevels[v] + 128);
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(bytes)));
}

// The stored quant (quant + bias) of row i, input e of a float panel block.
template <typename F>
uint8_t StoredQuant(const uint8_t* quants, int e, int i) {
  if constexpr (F::kSrcNibbles) {
    const NibblePlace at = NibbleAt(e, i);
    auto u = static_cast<uint8_t>((quants[at.byte] >> at.shift) & 0x0f);
    for (int t = 0; t < F::kSrcTopBits; ++t) {
      uint32_t word;
      std::memcpy(&word, quants + kFifthBitsOffset + 64 * t + 4 * (e / 2), sizeof(word));
      u |= static_cast<uint8_t>(((word >> (2 * i + e % 2)) & 1) << (4 + t));
    }
    return u;
  } else {
    return static_cast<uint8_t>(static_cast<int8_t>(quants[F::SrcByte(e, i)]) + F::kBias);
  }
}

// Quad vector j (inputs 4j..4j+3 of the 16 rows, one row a lane) of a block
// holds stored quants u. Whole bytes: vector j at kQuants + 64j, byte 4i + t
// = u(row i, input 4j + t). Otherwise nibble vector v = j / 2 at kQuants +
// 64v holds the low four bits of quad vectors 2v (low nibbles) and 2v + 1
// (high), byte for byte; after the four nibble vectors, top-bit plane g
// (64 bytes) holds, in byte 4i + t, bits 4.. of u for quad vectors
// (8 / kTopBits)g + k at bits kTopBits * k...
template <typename F>
void WriteIntegerQuants(const uint8_t* src_quants, uint8_t* dst_quants) {
  for (int i = 0; i < kPanelWidth; ++i) {
    for (int t = 0; t < 4; ++t) {
      for (int j = 0; j < 8; ++j) {
        const uint8_t u = StoredQuant<F>(src_quants, 4 * j + t, i);
        const int64_t lane_byte = 4 * i + t;
        if constexpr (F::kTopBits == 4) {
          dst_quants[kVectorBytes * j + lane_byte] = u;
          continue;
        }
        dst_quants[kVectorBytes * (j / 2) + lane_byte] |=
            static_cast<uint8_t>((u & 0x0f) << (4 * (j % 2)));
        if constexpr (F::kTopBits > 0) {
          constexpr int kPerPlane = 8 / F::kTopBits;
          dst_quants[kVectorBytes * (4 + j / kPerPlane) + lane_byte] |=
              static_cast<uint8_t>((u >> 4) << (F::kTopBits * (j % kPerPlane)));
        }
      }
    }
  }
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

// out rows [row0, row0 + R) x panels [n, n + 16P).
template <typename F, int R, int P>
void Tile(const uint8_t* panel, int64_t panel_bytes, int64_t blocks,
          const ActivationBlock* activations, int64_t row0, const Matrix& out, int64_t n,
          const float* bias) {
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
    const ActivationBlock* a[R];
    for (int r = 0; r < R; ++r) a[r] = activations + (row0 + r) * blocks + b;
    Unroll<0, F::kRuns>([&](auto run) {
      __m512i dots[R][P];
      for (int r = 0; r < R; ++r) {
        for (int p = 0; p < P; ++p) dots[r][p] = _mm512_setzero_si512();
      }
      constexpr int kQuadsPerRun = 8 / F::kRuns;
      Unroll<run * kQuadsPerRun, (run + 1) * kQuadsPerRun>([&](auto j) {
        __m512i w[P];
        for (int p = 0; p < P; ++p) w[p] = LoadQuad<F, j>(block[p] + F::kQuants, levels);
        for (int r = 0; r < R; ++r) {
          const __m512i x = Quad(a[r]->q + 4 * j);
          for (int p = 0; p < P; ++p) dots[r][p] = _mm512_dpbusd_epi32(dots[r][p], w[p], x);
        }
      });
      for (int p = 0; p < P; ++p) {
        const __m512 d = F::D(header[p], block[p], run);
        for (int r = 0; r < R; ++r) {
          __m512i i = dots[r][p];
          if constexpr (F::kBias != 0) {
            const int sum = F::kRuns == 1 ? a[r]->sums[0] + a[r]->sums[1] : a[r]->sums[run];
            i = _mm512_sub_epi32(i, _mm512_set1_epi32(F::kBias * sum));
          }
          acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(a[r]->d)),
                                      _mm512_cvtepi32_ps(i), acc[r][p]);
        }
      }
    });
    if constexpr (F::kHasMin) {
      for (int p = 0; p < P; ++p) {
        const __m512 m = F::M(header[p], block[p]);
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

template <typename F>
void Int8Rows(const PackedWeight& weight, const ActivationBlock* activations, int64_t rows,
              int64_t n0, int64_t n1, const float* bias, const Matrix& out) {
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
            Tile<F, r(), p()>(panel_at(n), weight.panel_bytes, blocks, activations, r0, out, n,
                              bias);
          }
        });
      });
    }
    n += panels * kPanelWidth;
  }
}

// The integer panels of `weight`: its float panels (PackWeight) with the
// headers and scales copied and the quants rewritten.
template <typename F>
std::unique_ptr<PackedWeight> ConvertPanels(const Weight& weight) {
  using L = typename F::L;
  // WriteIntegerQuants' vectors (eight of whole bytes, or four of nibbles
  // and a plane per top bit) fit the block.
  static_assert(F::kQuants + kVectorBytes * (F::kTopBits == 4 ? 8 : 4 + F::kTopBits) <=
                L::kBlockBytes);
  const std::unique_ptr<PackedWeight> source = PackWeight(weight);
  std::unique_ptr<PackedWeight> packed = AllocatePanels(weight, PanelBytes<L>(weight.cols));
  for (int64_t p = 0; p < weight.rows / kPanelWidth; ++p) {
    const uint8_t* from = source->data.get() + p * source->panel_bytes;
    uint8_t* to = packed->data.get() + p * packed->panel_bytes;
    for (int64_t b = 0; b < weight.cols / kBlockInputs; ++b) {
      std::memcpy(to + HeaderOffset<L>(b), from + HeaderOffset<L>(b), L::kHeaderBytes);
      const uint8_t* src_block = from + BlockOffset<L>(b);
      uint8_t* dst_block = to + BlockOffset<L>(b);
      std::memcpy(dst_block, src_block, F::kQuants);
      WriteIntegerQuants<F>(src_block + F::kQuants, dst_block + F::kQuants);
    }
  }
  return packed;
}

// Calls f(F{}) with the integer format of `dtype`.
template <typename Fn>
auto WithInt8Format(DType dtype, Fn&& f) {
  switch (dtype) {
    case DType::kQ4_1:
      return f(Q4_1Int8{});
    case DType::kQ4_0:
      return f(Q4_0Int8{});
    case DType::kQ5_0:
      return f(Q5_0Int8{});
    case DType::kQ4_K:
      return f(Q4KInt8{});
    case DType::kQ5_K:
      return f(Q5KInt8{});
    case DType::kQ5_1:
      return f(Q5_1Int8{});
    case DType::kQ6_K:
      return f(Q6KInt8{});
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return f(LevelsInt8{});
    default:
      return f(Q8_0Int8{});
  }
}

}  // namespace

bool HasInt8Products() { return true; }

std::unique_ptr<PackedWeight> PackWeightInt8(const Weight& weight) {
  return WithInt8Format(weight.dtype, [&](auto f) { return ConvertPanels<decltype(f)>(weight); });
}

int64_t PackedWeightBytesInt8(DType dtype, int64_t rows, int64_t cols) {
  return rows / kPanelWidth *
         WithInt8Format(dtype, [&](auto f) { return PanelBytes<typename decltype(f)::L>(cols); });
}

void MatMulPackedInt8Rows(const PackedWeight& weight, const ActivationBlock* activations,
                          int64_t rows, int64_t n0, int64_t n1, const float* bias,
                          const Matrix& out) {
  WithInt8Format(weight.dtype, [&](auto f) {
    Int8Rows<decltype(f)>(weight, activations, rows, n0, n1, bias, out);
  });
}

#else  // no AVX-512 VNNI: q8 keeps its block kernels, nothing calls these.

bool HasInt8Products() { return false; }

std::unique_ptr<PackedWeight> PackWeightInt8(const Weight&) { return nullptr; }

int64_t PackedWeightBytesInt8(DType, int64_t, int64_t) { return 0; }

void MatMulPackedInt8Rows(const PackedWeight&, const ActivationBlock*, int64_t, int64_t, int64_t,
                          const float*, const Matrix&) {}

#endif

}  // namespace tandem::kernels::cpu
