// The integer panels' formats (packed_matmul_int8.h), apart from any vector
// width: each packable type's layout, how its quants are stored, and where
// its scales are. The packer (packed_panels_int8.cc) and both kernels (AVX-512
// VNNI: packed_matmul_int8.cc; AVX2: packed_matmul_int8_avx2.cc) read them
// from here, so that the two kernels multiply the same bytes.
#ifndef TANDEM_ENGINE_KERNELS_CPU_PACKED_INT8_FORMATS_H_
#define TANDEM_ENGINE_KERNELS_CPU_PACKED_INT8_FORMATS_H_

#include <cstdint>

#include "engine/kernels/cpu/packed_matmul.h"
#include "engine/kernels/cpu/simd.h"
#include "engine/kernels/dtype.h"

// Which kernel multiplies the integer panels: AVX-512 VNNI's where the build
// has it, else AVX2's (any build that packs weights has AVX2).
#if defined(TANDEM_CPU_AVX512) && defined(__AVX512VNNI__)
#define TANDEM_CPU_INT8_VNNI 1
#elif defined(TANDEM_CPU_AVX2)
#define TANDEM_CPU_INT8_AVX2 1
#endif

namespace tandem::kernels::cpu::int8_panels {

inline constexpr int64_t kBlockInputs = 32;
// One quad vector: inputs 4j..4j+3 of the panel's 16 rows, a row's four in
// one 32-bit lane (packed_matmul_int8.h).
inline constexpr int64_t kVectorBytes = 64;

// Where a format's scale D (and its minimum's coefficient M) come from, read
// as the float kernels read them (exact products):
//   kHalves:               D = d                  (halves at the block's start)
//   kHalvesTimesUnsigned:  D = d * scale          (d in the header, scale bytes
//                          M = -(dmin * min)       unsigned; min bytes likewise)
//   kHalvesTimesSigned:    D = d * scale of the run (signed scale bytes)
// Q4_1's minimum is its own halves (M = m, kMinAt bytes into the block).
enum class ScaleForm { kHalves, kHalvesTimesUnsigned, kHalvesTimesSigned };
enum class MinForm { kNone, kHalves, kMinusDminTimesMin };

// Per format: the float panels' layout L (the same headers, and scales at
// the same offsets; only the quants from kQuants on are rewritten); whether
// the float panels hold nibbles, with kSrcTopBits fifth (and sixth) bits
// after them, or bytes (SrcByte: where row i's quant of input e is); the
// bias of the stored quants; their top bits beyond a nibble (0: nibbles, 4:
// whole bytes); whether a nibble is a level index (IQ4); the runs of inputs
// that share a scale; the scale's and the minimum's forms and offsets
// (kDAt from the header where the layout has one, else the block; kScaleAt
// per run from the block).
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

// Q4_0, Q5_0 and Q8_0: a half scale d at the block's start, no minimum. Q5_0
// stores the file's five-bit q (its value + 16): less the bias, the same
// integer products and scaling as the Q8_0 block it widens to where it has
// no panels of its own.
template <typename Layout, typename Source, int kStoredBias, int kTop>
struct OneScale : Source {
  using L = Layout;
  static constexpr int64_t kQuants = 32;
  static constexpr int kBias = kStoredBias, kTopBits = kTop, kRuns = 1;
  static constexpr bool kLevels = false;
  static constexpr ScaleForm kScale = ScaleForm::kHalves;
  static constexpr MinForm kMin = MinForm::kNone;
  static constexpr int64_t kDAt = 0, kScaleAt[2] = {0, 0}, kDminAt = 0, kMinAt = 0;
};
using Q4_0Int8 = OneScale<PlainLayout<32 + 256>, NibbleSource, 8, 0>;
using Q5_0Int8 = OneScale<Q5_0Layout, FiveBitSource, 16, 1>;
using Q8_0Int8 = OneScale<PlainLayout<32 + 512>, ByteSource, 128, 4>;

struct Q4_1Int8 : NibbleSource {
  using L = PlainLayout<32 + 32 + 256>;
  static constexpr int64_t kQuants = 64;
  static constexpr int kBias = 0, kTopBits = 0, kRuns = 1;
  static constexpr bool kLevels = false;
  static constexpr ScaleForm kScale = ScaleForm::kHalves;
  static constexpr MinForm kMin = MinForm::kHalves;
  static constexpr int64_t kDAt = 0, kScaleAt[2] = {0, 0}, kDminAt = 0, kMinAt = 32;
};

// Q4_K (nibbles), Q5_K and Q5_1 (a nibble and a top bit): D = d * scale,
// M = -(dmin * min).
template <typename Layout, typename Source, int kTop>
struct ScaledMin : Source {
  using L = Layout;
  static constexpr int64_t kQuants = L::kQuants;
  static constexpr int kBias = 0, kTopBits = kTop, kRuns = 1;
  static constexpr bool kLevels = false;
  static constexpr ScaleForm kScale = ScaleForm::kHalvesTimesUnsigned;
  static constexpr MinForm kMin = MinForm::kMinusDminTimesMin;
  static constexpr int64_t kDAt = L::kD, kScaleAt[2] = {L::kScale, L::kScale}, kDminAt = L::kDmin,
                           kMinAt = L::kMin;
};
using Q4KInt8 = ScaledMin<Q4KLayout, NibbleSource, 0>;
using Q5KInt8 = ScaledMin<Q5KLayout, FiveBitSource, 1>;
using Q5_1Int8 = ScaledMin<ScaledMinLayout, FiveBitSource, 1>;

// Q6_K: a nibble and two top bits, two runs of 16 inputs, D = d * scale of
// the run.
struct Q6KInt8 : SixBitSource {
  using L = Q6KLayout;
  static constexpr int64_t kQuants = L::kQuants;
  static constexpr int kBias = 32, kTopBits = 2, kRuns = 2;
  static constexpr bool kLevels = false;
  static constexpr ScaleForm kScale = ScaleForm::kHalvesTimesSigned;
  static constexpr MinForm kMin = MinForm::kNone;
  static constexpr int64_t kDAt = L::kD, kScaleAt[2] = {L::kScale0, L::kScale1}, kDminAt = 0,
                           kMinAt = 0;
};

// IQ4_NL and IQ4_XS: level indices, D = d * scale (both in the block).
struct LevelsInt8 : NibbleSource {
  using L = LevelsLayout;
  static constexpr int64_t kQuants = L::kQuants;
  static constexpr int kBias = 128, kTopBits = 0, kRuns = 1;
  static constexpr bool kLevels = true;
  static constexpr ScaleForm kScale = ScaleForm::kHalvesTimesSigned;
  static constexpr MinForm kMin = MinForm::kNone;
  static constexpr int64_t kDAt = L::kD, kScaleAt[2] = {L::kScale, L::kScale}, kDminAt = 0,
                           kMinAt = 0;
};

// The largest stored quant of a format (its bias included): what bounds the
// 16-bit pair sums of AVX2's multiply-add (packed_matmul_int8_avx2.cc).
template <typename F>
constexpr int MaxStoredQuant() {
  if constexpr (F::kTopBits == 4 || F::kLevels) return 255;
  return (1 << (4 + F::kTopBits)) - 1;
}

// Calls f(F{}) with the integer format of `dtype` (Q8_0's for the types that
// widen to it; HasInt8Panels tells which types have integer panels).
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

}  // namespace tandem::kernels::cpu::int8_panels

#endif  // TANDEM_ENGINE_KERNELS_CPU_PACKED_INT8_FORMATS_H_
