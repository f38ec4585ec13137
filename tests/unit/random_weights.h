// Test inputs shared by the kernel tests: random but valid weight bytes of
// every type.
#ifndef TANDEM_TESTS_UNIT_RANDOM_WEIGHTS_H_
#define TANDEM_TESTS_UNIT_RANDOM_WEIGHTS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "engine/kernels/dtype.h"
#include "engine/kernels/half.h"

namespace tandem::kernels {

inline constexpr DType kAllTypes[] = {DType::kF32,   DType::kF16,  DType::kBF16, DType::kQ8_0,
                                      DType::kQ4_0,  DType::kQ4_1, DType::kQ4_K, DType::kQ6_K,
                                      DType::kQ5_0,  DType::kQ5_1, DType::kQ5_K, DType::kIQ4_NL,
                                      DType::kIQ4_XS};

// Random but valid weight bytes: random payloads with small, finite scales.
inline std::vector<uint8_t> RandomWeights(DType type, int64_t rows, int64_t cols,
                                          std::mt19937& rng) {
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.002f, 0.05f);
  const size_t row_bytes = RowBytes(type, cols);
  std::vector<uint8_t> bytes(row_bytes * static_cast<size_t>(rows));
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  const int64_t elements = rows * cols;
  auto halves = [&](size_t stride, std::initializer_list<size_t> offsets) {
    for (size_t at = 0; at < bytes.size(); at += stride) {
      for (size_t o : offsets) {
        const uint16_t h = FloatToHalf(scale(rng));
        std::memcpy(&bytes[at + o], &h, 2);
      }
    }
  };
  switch (type) {
    case DType::kF32:
      for (int64_t i = 0; i < elements; ++i) {
        const float v = value(rng);
        std::memcpy(&bytes[static_cast<size_t>(i) * 4], &v, 4);
      }
      break;
    case DType::kF16:
      for (int64_t i = 0; i < elements; ++i) {
        const uint16_t h = FloatToHalf(value(rng));
        std::memcpy(&bytes[static_cast<size_t>(i) * 2], &h, 2);
      }
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < elements; ++i) {
        const uint16_t b = static_cast<uint16_t>(Float2Bits(value(rng)) >> 16);
        std::memcpy(&bytes[static_cast<size_t>(i) * 2], &b, 2);
      }
      break;
    case DType::kQ8_0:
      halves(sizeof(BlockQ8_0), {0});
      break;
    case DType::kQ4_0:
      halves(sizeof(BlockQ4_0), {0});
      break;
    case DType::kQ4_1:
      halves(sizeof(BlockQ4_1), {0, 2});
      break;
    case DType::kQ4_K:
      halves(sizeof(BlockQ4_K), {0, 2});
      break;
    case DType::kQ6_K:
      halves(sizeof(BlockQ6_K), {offsetof(BlockQ6_K, d)});
      break;
    case DType::kQ5_0:
      halves(sizeof(BlockQ5_0), {0});
      break;
    case DType::kQ5_1:
      halves(sizeof(BlockQ5_1), {0, 2});
      break;
    case DType::kQ5_K:
      halves(sizeof(BlockQ5_K), {0, 2});
      break;
    case DType::kIQ4_NL:
      halves(sizeof(BlockIQ4_NL), {0});
      break;
    case DType::kIQ4_XS:
      halves(sizeof(BlockIQ4_XS), {0});
      break;
  }
  return bytes;
}

}  // namespace tandem::kernels

#endif  // TANDEM_TESTS_UNIT_RANDOM_WEIGHTS_H_
