// Paged causal attention, one query row at a time: decode rows and short
// chunks (LaunchPagedAttention in kernels.h; prefill chunks go to
// prefill_attention.cu).
//
// One thread block per (query row, head, key split); its four warps take
// every fourth key of the split, each keeping an online softmax (running
// maximum, running sum, weighted sum of values) in registers, so no score
// matrix is ever stored. A lane holds head_dim / 32 consecutive dimensions,
// so one key's row is read by a warp as one contiguous run. The warps' states
// merge in shared memory; with several splits each block writes its unnormalised
// state and MergeSplitsKernel combines them (flash-decoding), which keeps all
// SMs busy on a long context with few rows.
#include <cuda_fp16.h>

#include <cmath>

#include "engine/kernels/cuda/kernels.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = 8;  // head_dim <= 256

struct SoftmaxState {
  float max = -INFINITY;
  float sum = 0.0f;
};

// Rescale factor from an old maximum to a new one; exp(-inf - x) is 0, and
// an empty state (-inf) has nothing to rescale.
__device__ float Rescale(float old_max, float new_max) {
  return old_max == -INFINITY ? 0.0f : expf(old_max - new_max);
}

template <int kPerLane>
__global__ void __launch_bounds__(kWarps * 32) AttentionKernel(AttentionArgs args) {
  const int64_t row = blockIdx.x;  // x: up to 2^31 - 1 rows
  const int head = blockIdx.y;
  const int split = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = args.heads / args.kv_heads;
  const int kv_head = head / group;
  const int64_t q_width = static_cast<int64_t>(args.heads) * args.head_dim;
  const int64_t token_stride = static_cast<int64_t>(args.kv_heads) * args.head_dim;

  const int32_t* table = args.row_info + args.row_info[row];
  const int keys = args.row_info[args.rows + row];
  if (keys < 0) return;  // a query tile's row: the tiled kernel computes it
  // A sliding window: the row's keys are [lowest, keys), split between blocks.
  const int lowest = args.window > 0 ? max(0, keys - args.window) : 0;
  const int per_split = (keys - lowest + args.splits - 1) / args.splits;
  const int first = lowest + split * per_split;
  const int end = min(keys, first + per_split);

  float q[kPerLane];
  const float* q_row = args.q + row * q_width + static_cast<int64_t>(head) * args.head_dim;
  for (int e = 0; e < kPerLane; ++e) q[e] = q_row[lane * kPerLane + e] * args.scale;

  SoftmaxState state;
  float acc[kPerLane] = {};
  for (int key = first + warp; key < end; key += kWarps) {
    const int64_t slot = static_cast<int64_t>(table[key / args.block_size]) * args.block_size +
                         key % args.block_size;
    const int64_t offset =
        slot * token_stride + static_cast<int64_t>(kv_head) * args.head_dim + lane * kPerLane;
    const __half* k = reinterpret_cast<const __half*>(args.k_pool) + offset;
    const __half* v = reinterpret_cast<const __half*>(args.v_pool) + offset;
    float dot = 0.0f;
    for (int e = 0; e < kPerLane; ++e) dot += q[e] * __half2float(k[e]);
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (args.softcap > 0.0f) dot = args.softcap * tanhf(dot / args.softcap);
    const float new_max = fmaxf(state.max, dot);
    const float old_scale = Rescale(state.max, new_max);
    const float p = expf(dot - new_max);
    state.sum = state.sum * old_scale + p;
    for (int e = 0; e < kPerLane; ++e) acc[e] = acc[e] * old_scale + p * __half2float(v[e]);
    state.max = new_max;
  }

  // Merge the warps.
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kMaxPerLane * 32];
  if (lane == 0) {
    warp_max[warp] = state.max;
    warp_sum[warp] = state.sum;
  }
  for (int e = 0; e < kPerLane; ++e) warp_acc[warp][lane * kPerLane + e] = acc[e];
  __syncthreads();
  float max = -INFINITY;
  for (int w = 0; w < kWarps; ++w) max = fmaxf(max, warp_max[w]);
  float sum = 0.0f;
  for (int w = 0; w < kWarps; ++w) sum += warp_sum[w] * Rescale(warp_max[w], max);
  for (int d = threadIdx.x; d < args.head_dim; d += blockDim.x) {
    float value = 0.0f;
    for (int w = 0; w < kWarps; ++w) value += warp_acc[w][d] * Rescale(warp_max[w], max);
    if (args.splits == 1) {
      args.out[row * q_width + static_cast<int64_t>(head) * args.head_dim + d] =
          sum > 0.0f ? value / sum : 0.0f;
    } else {
      float* part =
          args.partial + ((static_cast<int64_t>(split) * args.rows + row) * args.heads + head) *
                             (args.head_dim + 2);
      part[2 + d] = value;
      if (d == 0) {
        part[0] = max;
        part[1] = sum;
      }
    }
  }
}

// Combines the splits' states of one (row, head): one block, head_dim threads.
__global__ void MergeSplitsKernel(AttentionArgs args) {
  const int64_t row = blockIdx.x;
  const int head = blockIdx.y;
  const int d = threadIdx.x;
  if (args.row_info[args.rows + row] < 0) return;  // a query tile's row
  const int64_t stride = static_cast<int64_t>(args.rows) * args.heads * (args.head_dim + 2);
  const float* first = args.partial + (row * args.heads + head) * (args.head_dim + 2);
  float max = -INFINITY;
  for (int s = 0; s < args.splits; ++s) max = fmaxf(max, first[s * stride]);
  float sum = 0.0f;
  float value = 0.0f;
  for (int s = 0; s < args.splits; ++s) {
    const float* part = first + s * stride;
    const float scale = Rescale(part[0], max);
    sum += part[1] * scale;
    value += part[2 + d] * scale;
  }
  args.out[row * args.heads * args.head_dim + static_cast<int64_t>(head) * args.head_dim + d] =
      sum > 0.0f ? value / sum : 0.0f;
}

}  // namespace

void LaunchPagedAttention(const AttentionArgs& args, cudaStream_t stream) {
  if (args.rows == 0) return;
  if (args.tile_count > 0) LaunchTiledPrefillAttention(args, stream);
  const dim3 grid(static_cast<unsigned>(args.rows), static_cast<unsigned>(args.heads),
                  static_cast<unsigned>(args.splits));
  const int threads = kWarps * 32;
  switch (args.head_dim / 32) {
    case 1:
      AttentionKernel<1><<<grid, threads, 0, stream>>>(args);
      break;
    case 2:
      AttentionKernel<2><<<grid, threads, 0, stream>>>(args);
      break;
    case 3:
      AttentionKernel<3><<<grid, threads, 0, stream>>>(args);
      break;
    case 4:
      AttentionKernel<4><<<grid, threads, 0, stream>>>(args);
      break;
    case 5:
      AttentionKernel<5><<<grid, threads, 0, stream>>>(args);
      break;
    case 6:
      AttentionKernel<6><<<grid, threads, 0, stream>>>(args);
      break;
    case 7:
      AttentionKernel<7><<<grid, threads, 0, stream>>>(args);
      break;
    default:
      AttentionKernel<8><<<grid, threads, 0, stream>>>(args);
      break;
  }
  if (args.splits > 1) {
    MergeSplitsKernel<<<dim3(static_cast<unsigned>(args.rows), static_cast<unsigned>(args.heads)),
                        static_cast<unsigned>(args.head_dim), 0, stream>>>(args);
  }
}

}  // namespace tandem::kernels::cuda
