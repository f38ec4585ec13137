#include "engine/kernels/dtype.h"

namespace tandem::kernels {

const DTypeInfo& Info(DType type) {
  static constexpr DTypeInfo kInfo[] = {
      {"F32", 1, 4},
      {"F16", 1, 2},
      {"BF16", 1, 2},
      {"Q8_0", BlockQ8_0::kElements, sizeof(BlockQ8_0)},
      {"Q4_0", BlockQ4_0::kElements, sizeof(BlockQ4_0)},
      {"Q4_1", BlockQ4_1::kElements, sizeof(BlockQ4_1)},
      {"Q4_K", BlockQ4_K::kElements, sizeof(BlockQ4_K)},
      {"Q6_K", BlockQ6_K::kElements, sizeof(BlockQ6_K)},
      {"Q5_0", BlockQ5_0::kElements, sizeof(BlockQ5_0)},
      {"Q5_1", BlockQ5_1::kElements, sizeof(BlockQ5_1)},
      {"Q5_K", BlockQ5_K::kElements, sizeof(BlockQ5_K)},
      {"IQ4_NL", BlockIQ4_NL::kElements, sizeof(BlockIQ4_NL)},
      {"IQ4_XS", BlockIQ4_XS::kElements, sizeof(BlockIQ4_XS)},
  };
  return kInfo[static_cast<int>(type)];
}

}  // namespace tandem::kernels
