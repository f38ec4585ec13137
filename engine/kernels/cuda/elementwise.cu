// The CUDA backend's elementwise, normalisation, rotary and KV-page kernels
// (launchers declared in kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "engine/kernels/cuda/kernels.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  // Grid-stride loops: enough blocks to fill the device, no more.
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65535));
}

// Sum of `value` over the block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the total.
__device__ float BlockSum(float value) {
  __shared__ float warp_sums[32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float total = lane < warps ? warp_sums[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) {
    total += __shfl_xor_sync(0xffffffffu, total, offset);
  }
  return total;
}

__global__ void EmbedBf16Kernel(const __nv_bfloat16* table, int64_t cols, const int32_t* ids,
                                float* out) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* src = table + static_cast<int64_t>(ids[row]) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[row * cols + c] = __bfloat162float(src[c]);
  }
}

__global__ void EmbedF32Kernel(const float* table, int64_t cols, const int32_t* ids, float* out) {
  const int64_t row = blockIdx.x;
  const float* src = table + static_cast<int64_t>(ids[row]) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[row * cols + c] = src[c];
}

// One block per row. Each thread reads and writes the same elements in both
// loops, so out may alias x (and, in AddRmsNorm, x may be out).
__global__ void RmsNormKernel(float* acc, const float* x, const float* weight, int64_t cols,
                              float eps, float* out) {
  const int64_t row = blockIdx.x;
  float* a = acc != nullptr ? acc + row * cols : nullptr;
  const float* xr = x + row * cols;
  float* o = out + row * cols;
  float squares = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float value = xr[c];
    if (a != nullptr) {
      value += a[c];
      a[c] = value;
    }
    squares += value * value;
  }
  const float scale = rsqrtf(BlockSum(squares) / static_cast<float>(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float value = a != nullptr ? a[c] : xr[c];
    o[c] = (value * scale) * weight[c];
  }
}

// Rotates the heads of one row in place (called by the threads of a block).
__device__ void RotateRow(float* row, int heads, int head_dim, int32_t position,
                          const RopeArgs& rope) {
  const int pairs = rope.rotary_dims / 2;
  const float* cos_sin = rope.table + static_cast<int64_t>(position) * pairs * 2;
  for (int i = threadIdx.x; i < heads * pairs; i += blockDim.x) {
    const int head = i / pairs;
    const int pair = i % pairs;
    float* v = row + static_cast<int64_t>(head) * head_dim;
    const int a = rope.neox ? pair : 2 * pair;
    const int b = rope.neox ? pair + pairs : 2 * pair + 1;
    const float c = cos_sin[2 * pair];
    const float s = cos_sin[2 * pair + 1];
    const float x0 = v[a];
    const float x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
  }
}

__global__ void RopeKernel(float* x, int heads, int head_dim, const int32_t* positions,
                           RopeArgs rope) {
  const int64_t row = blockIdx.x;
  RotateRow(x + row * heads * head_dim, heads, head_dim, positions[row], rope);
}

// A slot of -1 (a row that only pads a recorded step) stores nothing.
__device__ void StoreKvRow(const float* k, const float* v, int64_t width, int32_t slot,
                           __half* k_pool, __half* v_pool) {
  if (slot < 0) return;
  __half* kd = k_pool + static_cast<int64_t>(slot) * width;
  __half* vd = v_pool + static_cast<int64_t>(slot) * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    kd[i] = __float2half_rn(k[i]);  // round to nearest even, as the CPU backend
    vd[i] = __float2half_rn(v[i]);
  }
}

__global__ void RopeWriteKvKernel(float* q, float* k, const float* v, int heads, int kv_heads,
                                  int head_dim, const int32_t* positions, const int32_t* slots,
                                  RopeArgs rope, __half* k_pool, __half* v_pool) {
  const int64_t row = blockIdx.x;
  const int64_t kv_width = static_cast<int64_t>(kv_heads) * head_dim;
  RotateRow(q + row * heads * head_dim, heads, head_dim, positions[row], rope);
  float* k_row = k + row * kv_width;
  RotateRow(k_row, kv_heads, head_dim, positions[row], rope);
  __syncthreads();  // the rotated k row, written by other threads of the block
  StoreKvRow(k_row, v + row * kv_width, kv_width, slots[row], k_pool, v_pool);
}

__global__ void WriteKvKernel(const float* k, const float* v, int64_t width, const int32_t* slots,
                              __half* k_pool, __half* v_pool) {
  const int64_t row = blockIdx.x;
  StoreKvRow(k + row * width, v + row * width, width, slots[row], k_pool, v_pool);
}

__global__ void CopyKvBlockKernel(uint16_t* base, int64_t pool_stride, int64_t from, int64_t to,
                                  int64_t halves) {
  uint16_t* pool = base + blockIdx.y * pool_stride;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < halves;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    pool[to + i] = pool[from + i];
  }
}

__global__ void SiluMulKernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = (g / (1.0f + expf(-g))) * up[i];
  }
}

// gelu(x) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3): the CPU's form.
__global__ void GeluMulKernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = gate[i];
    const float inner = x + 0.044715f * (x * x * x);
    out[i] = (x / (1.0f + expf(-1.5957691216057308f * inner))) * up[i];
  }
}

__global__ void ScaleKernel(float* x, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] *= factor;
  }
}

__global__ void SoftcapKernel(float* x, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = cap * tanhf(x[i] / cap);
  }
}

__global__ void ScatterAddRowsKernel(float* acc, const float* x, int64_t cols, const int32_t* rows,
                                     const float* weights) {
  const int64_t i = blockIdx.x;
  float* dst = acc + static_cast<int64_t>(rows[i]) * cols;
  const float w = weights[i];
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] += w * x[i * cols + c];
}

__global__ void AddKernel(float* acc, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc[i] += x[i];
  }
}

__global__ void AddBiasKernel(float* out, int64_t rows, int64_t cols, const float* bias) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] += bias[i % cols];
  }
}

__global__ void GatherRowsKernel(const float* x, int64_t cols, const int32_t* rows, float* out) {
  const int64_t row = blockIdx.x;
  const float* src = x + static_cast<int64_t>(rows[row]) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[row * cols + c] = src[c];
}

// The better of two (value, index) candidates: larger value, then lower
// index; a NaN never beats anything.
__device__ void Better(float& value, int32_t& index, float other_value, int32_t other_index) {
  if (other_value > value || (other_value == value && other_index < index)) {
    value = other_value;
    index = other_index;
  }
}

// One block per row.
__global__ void ArgMaxRowsKernel(const float* x, int64_t cols, int32_t* out) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  float value = -INFINITY;
  int32_t index = INT32_MAX;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    Better(value, index, row[c], static_cast<int32_t>(c));
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    Better(value, index, __shfl_xor_sync(0xffffffffu, value, offset),
           __shfl_xor_sync(0xffffffffu, index, offset));
  }
  __shared__ float warp_values[32];
  __shared__ int32_t warp_indices[32];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_values[warp] = value;
    warp_indices[warp] = index;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    value = lane < warps ? warp_values[lane] : -INFINITY;
    index = lane < warps ? warp_indices[lane] : INT32_MAX;
    for (int offset = 16; offset > 0; offset >>= 1) {
      Better(value, index, __shfl_xor_sync(0xffffffffu, value, offset),
             __shfl_xor_sync(0xffffffffu, index, offset));
    }
    // A row of NaNs and negative infinities: the first index, as the
    // sequential rule gives.
    if (lane == 0) out[blockIdx.x] = index == INT32_MAX ? 0 : index;
  }
}

__global__ void ToBf16Kernel(const float* x, int64_t n, __nv_bfloat16* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(x[i]);
  }
}

}  // namespace

// Row kernels run one block per row; the grid's x dimension allows 2^31 - 1.
void LaunchEmbedBf16(const uint16_t* table, int64_t cols, const int32_t* ids, int64_t rows,
                     float* out, cudaStream_t stream) {
  if (rows == 0) return;
  EmbedBf16Kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(table), cols, ids, out);
}

void LaunchEmbedF32(const float* table, int64_t cols, const int32_t* ids, int64_t rows, float* out,
                    cudaStream_t stream) {
  if (rows == 0) return;
  EmbedF32Kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(table, cols, ids, out);
}

void LaunchRmsNorm(const float* x, const float* weight, int64_t rows, int64_t cols, float eps,
                   float* out, cudaStream_t stream) {
  if (rows == 0) return;
  RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(nullptr, x, weight, cols, eps,
                                                                      out);
}

void LaunchAddRmsNorm(float* acc, const float* x, const float* weight, int64_t rows, int64_t cols,
                      float eps, float* out, cudaStream_t stream) {
  if (rows == 0) return;
  RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(acc, x, weight, cols, eps,
                                                                      out);
}

void LaunchRope(float* x, int64_t rows, int heads, int head_dim, const int32_t* positions,
                const RopeArgs& rope, cudaStream_t stream) {
  if (rows == 0) return;
  RopeKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, heads, head_dim, positions,
                                                                   rope);
}

void LaunchRopeWriteKv(float* q, float* k, const float* v, int64_t rows, int heads, int kv_heads,
                       int head_dim, const int32_t* positions, const int32_t* slots,
                       const RopeArgs& rope, uint16_t* k_pool, uint16_t* v_pool,
                       cudaStream_t stream) {
  if (rows == 0) return;
  RopeWriteKvKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      q, k, v, heads, kv_heads, head_dim, positions, slots, rope, reinterpret_cast<__half*>(k_pool),
      reinterpret_cast<__half*>(v_pool));
}

void LaunchWriteKv(const float* k, const float* v, int64_t rows, int64_t width,
                   const int32_t* slots, uint16_t* k_pool, uint16_t* v_pool, cudaStream_t stream) {
  if (rows == 0) return;
  WriteKvKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      k, v, width, slots, reinterpret_cast<__half*>(k_pool), reinterpret_cast<__half*>(v_pool));
}

void LaunchCopyKvBlock(uint16_t* base, int pools, int64_t pool_stride, int64_t from, int64_t to,
                       int64_t halves, cudaStream_t stream) {
  if (pools == 0 || halves == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min(Blocks(halves), 64)),
                  static_cast<unsigned>(pools));
  CopyKvBlockKernel<<<grid, kThreads, 0, stream>>>(base, pool_stride, from, to, halves);
}

void LaunchSiluMul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return;
  SiluMulKernel<<<Blocks(n), kThreads, 0, stream>>>(gate, up, n, out);
}

void LaunchGeluMul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return;
  GeluMulKernel<<<Blocks(n), kThreads, 0, stream>>>(gate, up, n, out);
}

void LaunchScale(float* x, int64_t n, float factor, cudaStream_t stream) {
  if (n == 0) return;
  ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, factor);
}

void LaunchSoftcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n == 0) return;
  SoftcapKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, cap);
}

void LaunchScatterAddRows(float* acc, const float* x, int64_t cols, const int32_t* rows,
                          const float* weights, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  ScatterAddRowsKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(acc, x, cols, rows,
                                                                          weights);
}

void LaunchAdd(float* acc, const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  AddKernel<<<Blocks(n), kThreads, 0, stream>>>(acc, x, n);
}

void LaunchAddBias(float* out, int64_t rows, int64_t cols, const float* bias, cudaStream_t stream) {
  if (rows * cols == 0) return;
  AddBiasKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(out, rows, cols, bias);
}

void LaunchGatherRows(const float* x, int64_t cols, const int32_t* rows, int64_t n, float* out,
                      cudaStream_t stream) {
  if (n == 0) return;
  GatherRowsKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, cols, rows, out);
}

void LaunchArgMaxRows(const float* x, int64_t rows, int64_t cols, int32_t* out,
                      cudaStream_t stream) {
  if (rows == 0) return;
  ArgMaxRowsKernel<<<static_cast<unsigned>(rows), 1024, 0, stream>>>(x, cols, out);
}

void LaunchToBf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n == 0) return;
  ToBf16Kernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, reinterpret_cast<__nv_bfloat16*>(out));
}

}  // namespace tandem::kernels::cuda
