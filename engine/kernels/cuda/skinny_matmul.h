// Matrix products of a few rows (decode steps) as our own kernel: every
// weight of one MatMul call (Q, K and V; gate and up) in one launch.
//
// A decode step multiplies a handful of activation rows by every weight
// matrix: the product only streams the weights, so what counts is how close
// the read comes to the memory bandwidth, and how few launches a layer
// needs. cuBLAS runs each weight as its own GEMM, sized for large products;
// here one warp computes one output row for all the activation rows from
// 16-byte evict-first loads of that weight row (read once), and one launch
// covers the rows of up to kMaxWeights matrices.
//
// Numerics: bf16 x bf16 products summed in float32, as the cuBLAS path.
// Each output's reduction order is fixed (a lane sums its 8-element chunks in
// order, then a fixed shuffle tree), whatever the number of rows or weights.
//
// Plain C++ (no CUDA syntax): the backend and tandem-cuda-ceilings call it.
#ifndef TANDEM_ENGINE_KERNELS_CUDA_SKINNY_MATMUL_H_
#define TANDEM_ENGINE_KERNELS_CUDA_SKINNY_MATMUL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::kernels::cuda {

struct SkinnyMatMulArgs {
  static constexpr int kMaxRows = 8;     // activation rows
  static constexpr int kMaxWeights = 4;  // matrices in one launch

  const uint16_t* x = nullptr;  // bf16 [rows][k]
  int rows = 0;
  int64_t k = 0;
  int weights = 0;
  const uint16_t* w[kMaxWeights] = {};  // bf16 [n[i]][k]
  int64_t n[kMaxWeights] = {};
  float* out[kMaxWeights] = {};  // float32, row t at out[i] + t * ld[i]
  int64_t ld[kMaxWeights] = {};
  const float* bias[kMaxWeights] = {};  // [n[i]] or null
};

// Whether the kernel takes these arguments: 1..kMaxRows rows, 1..kMaxWeights
// weights, k a multiple of 8 and x and every weight 16-byte aligned.
bool SkinnyMatMulFits(const SkinnyMatMulArgs& args);

// out[i][t][r] = sum_c x[t][c] w[i][r][c] (+ bias[i][r]). REQUIRES:
// SkinnyMatMulFits(args). Asynchronous on `stream`; capturable.
void LaunchSkinnyMatMul(const SkinnyMatMulArgs& args, cudaStream_t stream);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_ENGINE_KERNELS_CUDA_SKINNY_MATMUL_H_
