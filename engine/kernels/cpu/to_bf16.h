// Whole weight matrices decoded to bfloat16 on the host: how a device backend
// that multiplies in bf16 (the CUDA one) turns a GGUF tensor of any supported
// type into what it uploads. The definition of each format is DequantizeRow's;
// this adds the rounding (to nearest even) and spreads rows over threads.
#ifndef TANDEM_ENGINE_KERNELS_CPU_TO_BF16_H_
#define TANDEM_ENGINE_KERNELS_CPU_TO_BF16_H_

#include <cstdint>

#include "engine/kernels/dtype.h"

namespace tandem::kernels::cpu {

// dst[r * cols + c] = bf16(element c of row r of `src`), for a row-major
// [rows][cols] tensor of `type`. Uses up to `threads` threads (at least one).
// REQUIRES: cols % Info(type).block_elements == 0.
void DequantizeToBf16(DType type, const void* src, int64_t rows, int64_t cols, uint16_t* dst,
                      int threads);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_TO_BF16_H_
