// Packs the integer panels of packed_matmul_int8.h: the float panels
// (PackWeight) with their headers and scales copied and their quants
// rewritten in the order the integer dot products take them. Scalar code,
// the same for both kernels (packed_int8_formats.h).
#include <cstring>
#include <memory>

#include "engine/kernels/cpu/packed_int8_formats.h"
#include "engine/kernels/cpu/packed_matmul.h"
#include "engine/kernels/cpu/packed_matmul_int8.h"

namespace tandem::kernels::cpu {

#ifdef TANDEM_CPU_AVX2
namespace {

using int8_panels::kBlockInputs;
using int8_panels::kVectorBytes;

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

}  // namespace

std::unique_ptr<PackedWeight> PackWeightInt8(const Weight& weight) {
  return int8_panels::WithInt8Format(weight.dtype,
                                     [&](auto f) { return ConvertPanels<decltype(f)>(weight); });
}

int64_t PackedWeightBytesInt8(DType dtype, int64_t rows, int64_t cols) {
  return rows / kPanelWidth * int8_panels::WithInt8Format(dtype, [&](auto f) {
           return PanelBytes<typename decltype(f)::L>(cols);
         });
}

#else  // no AVX2: nothing is packed, and q8 keeps its block kernels.

bool HasInt8Products() { return false; }

std::unique_ptr<PackedWeight> PackWeightInt8(const Weight&) { return nullptr; }

int64_t PackedWeightBytesInt8(DType, int64_t, int64_t) { return 0; }

void MatMulPackedInt8Rows(const PackedWeight&, const ActivationBlock*, int64_t, int64_t, int64_t,
                          const float*, const Matrix&) {}

#endif  // TANDEM_CPU_AVX2

}  // namespace tandem::kernels::cpu
