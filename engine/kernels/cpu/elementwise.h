// Row-wise and elementwise CPU kernels: RMSNorm, rotary embedding, SiLU- and
// GELU-and-multiply, scaling, soft-capping, residual add. Each row is processed independently, in a
// fixed order, so results never depend on the rest of the batch.
#ifndef TANDEM_ENGINE_KERNELS_CPU_ELEMENTWISE_H_
#define TANDEM_ENGINE_KERNELS_CPU_ELEMENTWISE_H_

#include <cstdint>
#include <span>

#include "engine/kernels/backend.h"
#include "engine/kernels/cpu/compute_pool.h"

namespace tandem::kernels::cpu {

void RmsNormRow(const float* x, const float* weight, int64_t n, float eps, float* out);
void RmsNorm(ComputeLane& pool, const Matrix& x, const float* weight, float eps, Matrix out);
void Rope(ComputeLane& pool, Matrix x, int heads, int head_dim, std::span<const int32_t> positions,
          const RopeSpec& rope);
void SiluMul(ComputeLane& pool, const Matrix& gate, const Matrix& up, Matrix out);
void GeluMul(ComputeLane& pool, const Matrix& gate, const Matrix& up, Matrix out);
void Scale(ComputeLane& pool, Matrix x, float factor);
// x = cap * tanh(x / cap); SoftcapRow for one row (attention scores).
void SoftcapRow(float* x, int64_t n, float cap);
void Softcap(ComputeLane& pool, Matrix x, float cap);
void Add(ComputeLane& pool, Matrix acc, const Matrix& x);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_ELEMENTWISE_H_
