// Quantization of float32 weight rows into GGUF block formats: what writes a
// model file of a chosen type (tandem-bench --write_gguf) without an F16 copy
// and without llama.cpp's quantizer.
//
// Q8_0, Q5_0 and Q5_1 round as ggml's reference quantizers do (the gguf
// package's quantize_blocks, llama-quantize without an importance matrix), so
// their blocks are bit for bit the ones llama.cpp writes; IQ4_NL and IQ4_XS
// follow llama-quantize's search without an importance matrix step for step,
// with the same result. The K-quants (Q4_K,
// Q5_K, Q6_K) have no one right answer: each sub-block's scale (and min) is
// the least-squares fit of the best of a few candidate roundings, then the
// super-block's six- or eight-bit scales are rounded and the elements
// re-rounded against them. tests/reference/test_quantizer.py holds their
// error to llama.cpp's on the same weights.
#ifndef TANDEM_ENGINE_MODEL_QUANTIZE_H_
#define TANDEM_ENGINE_MODEL_QUANTIZE_H_

#include <cstdint>

#include "engine/kernels/dtype.h"

namespace tandem::model {

// Whether QuantizeRow writes `type`: F32, F16, BF16, Q8_0, Q5_0, Q5_1, Q4_K,
// Q5_K, Q6_K, IQ4_NL and IQ4_XS.
bool CanQuantize(kernels::DType type);

// Writes `elements` floats of `src` as `type` to `dst` (RowBytes(type,
// elements) bytes). REQUIRES: CanQuantize(type), elements a multiple of the
// type's block, every value finite.
void QuantizeRow(kernels::DType type, const float* src, int64_t elements, void* dst);

}  // namespace tandem::model

#endif  // TANDEM_ENGINE_MODEL_QUANTIZE_H_
