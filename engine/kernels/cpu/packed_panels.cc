// Packing: GGUF rows re-laid out as the panels of packed_matmul.h. Scalar
// code, the same for every instruction set that has panel kernels (AVX2 and
// AVX-512); the kernels that read the panels are in packed_matmul.cc
// (AVX-512) and packed_matmul_avx2.cc.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common/check.h"
#include "engine/kernels/cpu/block32.h"
#include "engine/kernels/cpu/dequantize.h"
#include "engine/kernels/cpu/packed_matmul.h"
#include "engine/kernels/cpu/simd.h"  // TANDEM_CPU_AVX2 only: the code is scalar

namespace tandem::kernels::cpu {

#ifdef TANDEM_CPU_AVX2
namespace {

constexpr int64_t kBlockInputs = 32;

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

// The Block32 packers: each writes a panel's block (and, each time again,
// its header) from the 16 rows' blocks.

// Q4_K (Q4KLayout, nibbles), Q5_K (Q5KLayout) and Q5_1 (ScaledMinLayout),
// five bits: d, dmin, scale, min and the quants.
template <typename Layout, bool kFiveBits>
struct ScaledMinPacker {
  using L = Layout;
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

// Q6_K: d, the two scales, the quants + 32 in six bits.
struct TwoScalePacker {
  using L = Q6KLayout;
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

// IQ4_NL and IQ4_XS: d, the scale, the level indices.
struct LevelsPacker {
  using L = LevelsLayout;
  static void Pack(const Block32 (&rows)[kPanelWidth], uint8_t* /*header*/, uint8_t* dst) {
    for (int i = 0; i < kPanelWidth; ++i) {
      std::memcpy(dst + L::kD + 2 * i, &rows[i].d, 2);
      dst[L::kScale + i] = static_cast<uint8_t>(rows[i].scale[0]);
      PackQuants<0>(rows[i].q, i, dst + L::kQuants);
    }
  }
};

// The panels of a Block32 type by packer P.
template <typename P>
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
      P::Pack(rows, panel + HeaderOffset<typename P::L>(b), panel + BlockOffset<typename P::L>(b));
    }
  }
}

// The panel layout of `dtype` (packed_matmul.h).
int64_t PanelBytesOf(DType dtype, int64_t cols) {
  switch (dtype) {
    case DType::kQ4_1:
      return PanelBytes<Q4_1Layout>(cols);
    case DType::kQ4_0:
      return PanelBytes<Q4_0Layout>(cols);
    case DType::kQ5_0:
      return PanelBytes<Q5_0Layout>(cols);
    case DType::kQ4_K:
      return PanelBytes<Q4KLayout>(cols);
    case DType::kQ5_K:
      return PanelBytes<Q5KLayout>(cols);
    case DType::kQ5_1:
      return PanelBytes<ScaledMinLayout>(cols);
    case DType::kQ6_K:
      return PanelBytes<Q6KLayout>(cols);
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return PanelBytes<LevelsLayout>(cols);
    case DType::kF16:
    case DType::kBF16:
      return PanelBytes<HalfLayout>(cols);
    default:
      return PanelBytes<Q8_0Layout>(cols);
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
  return rows / kPanelWidth * PanelBytesOf(dtype, cols);
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
  TANDEM_CHECK(packed->data != nullptr, "out of memory for a weight's packed panels");
  std::memset(packed->data.get(), 0, bytes);
  return packed;
}

std::unique_ptr<PackedWeight> PackWeight(const Weight& weight) {
  std::unique_ptr<PackedWeight> packed =
      AllocatePanels(weight, PanelBytesOf(weight.dtype, weight.cols));
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
    case DType::kQ4_K:
      PackBlock32Panels<ScaledMinPacker<Q4KLayout, false>>(weight, *packed);
      break;
    case DType::kQ5_K:
      PackBlock32Panels<ScaledMinPacker<Q5KLayout, true>>(weight, *packed);
      break;
    case DType::kQ5_1:
      PackBlock32Panels<ScaledMinPacker<ScaledMinLayout, true>>(weight, *packed);
      break;
    case DType::kQ6_K:
      PackBlock32Panels<TwoScalePacker>(weight, *packed);
      break;
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      PackBlock32Panels<LevelsPacker>(weight, *packed);
      break;
    default:
      TANDEM_CHECK(false, "PackWeight of a type CanPackWeight refuses");
  }
  return packed;
}

#else  // no AVX2: nothing is packed (CanPackWeight is false), so the other
       // functions are never reached.

bool CanPackWeight(DType, int64_t, int64_t) { return false; }

int64_t PackedWeightBytes(DType, int64_t, int64_t) { return 0; }

std::unique_ptr<PackedWeight> AllocatePanels(const Weight&, int64_t) { return nullptr; }

std::unique_ptr<PackedWeight> PackWeight(const Weight&) { return nullptr; }

#endif  // TANDEM_CPU_AVX2

}  // namespace tandem::kernels::cpu
