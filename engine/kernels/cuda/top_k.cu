// The k largest logits of each row, for sampling from candidates
// (LaunchTopKRows in kernels.h).
//
// One block per row. Values become order-preserving 32-bit keys; four
// passes of 8-bit histograms over the row find the k-th largest key exactly
// (radix select). Every larger element is a candidate; of the elements equal
// to it, those with the lowest indices fill the rest, taken in index order.
// A bitonic sort in shared memory then orders the k candidates by value
// (descending) and index (ascending): the sampler's order.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "engine/kernels/cuda/kernels.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kSlots = kMaxDeviceTopK;  // power of two, for the bitonic sort
static_assert((kSlots & (kSlots - 1)) == 0);

// Larger float, larger key; NaN below everything.
__device__ uint32_t OrderKey(float value) {
  if (isnan(value)) return 0;
  if (value == 0.0f) value = 0.0f;  // -0 equals +0, as a float comparison says
  const uint32_t bits = __float_as_uint(value);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Whether candidate a goes before candidate b.
__device__ bool Before(uint32_t key_a, int32_t id_a, uint32_t key_b, int32_t id_b) {
  return key_a != key_b ? key_a > key_b : id_a < id_b;
}

__global__ void __launch_bounds__(kThreads)
    TopKRowsKernel(const float* x, int64_t cols, int k, float* values, int32_t* ids) {
  __shared__ uint32_t counts[256];
  __shared__ uint32_t slot_keys[kSlots];
  __shared__ int32_t slot_ids[kSlots];
  __shared__ uint32_t prefix_shared, remaining_shared, taken;
  __shared__ uint32_t warp_flags[kThreads / 32];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;

  // Radix select: the k-th largest key, 8 bits at a time from the top.
  uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) counts[b] = 0;
    __syncthreads();
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const uint32_t key = OrderKey(row[c]);
      if ((key & mask) == prefix) atomicAdd(&counts[(key >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t above = 0;
      int bucket = 255;
      for (; bucket > 0; --bucket) {
        if (above + counts[bucket] >= remaining) break;
        above += counts[bucket];
      }
      prefix_shared = prefix | (static_cast<uint32_t>(bucket) << shift);
      remaining_shared = remaining - above;
    }
    __syncthreads();
    prefix = prefix_shared;
    remaining = remaining_shared;
    mask |= 0xFFu << shift;
    __syncthreads();
  }
  const uint32_t threshold = prefix;  // the k-th largest key
  // `remaining` elements equal to it are taken; k - remaining are above it.

  for (int s = threadIdx.x; s < kSlots; s += blockDim.x) {
    slot_keys[s] = 0;
    slot_ids[s] = INT32_MAX;
  }
  if (threadIdx.x == 0) taken = 0;
  __syncthreads();
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const uint32_t key = OrderKey(row[c]);
    if (key > threshold) {
      const uint32_t slot = atomicAdd(&taken, 1u);
      slot_keys[slot] = key;
      slot_ids[slot] = static_cast<int32_t>(c);
    }
  }
  __syncthreads();
  // Equal elements in index order, a block-wide chunk at a time.
  const uint32_t above = taken;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  uint32_t equal_taken = 0;
  for (int64_t base = 0; base < cols && equal_taken < remaining; base += blockDim.x) {
    const int64_t c = base + threadIdx.x;
    const bool equal = c < cols && OrderKey(row[c]) == threshold;
    const uint32_t ballot = __ballot_sync(0xffffffffu, equal);
    if (lane == 0) warp_flags[warp] = static_cast<uint32_t>(__popc(ballot));
    __syncthreads();
    uint32_t before = 0;
    for (int w = 0; w < warp; ++w) before += warp_flags[w];
    before += static_cast<uint32_t>(__popc(ballot & ((1u << lane) - 1u)));
    const uint32_t rank = equal_taken + before;
    if (equal && rank < remaining) {
      slot_keys[above + rank] = threshold;
      slot_ids[above + rank] = static_cast<int32_t>(c);
    }
    uint32_t chunk = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) chunk += warp_flags[w];
    equal_taken += chunk;
    __syncthreads();  // warp_flags is rewritten by the next chunk
  }
  __syncthreads();

  // Bitonic sort of the slots: most likely first.
  for (int size = 2; size <= kSlots; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < kSlots; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const bool ascending_block = (i & size) == 0;
          const bool i_first = Before(slot_keys[i], slot_ids[i], slot_keys[j], slot_ids[j]);
          if (ascending_block != i_first) {
            const uint32_t key = slot_keys[i];
            slot_keys[i] = slot_keys[j];
            slot_keys[j] = key;
            const int32_t id = slot_ids[i];
            slot_ids[i] = slot_ids[j];
            slot_ids[j] = id;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int s = threadIdx.x; s < k; s += blockDim.x) {
    const int32_t id = slot_ids[s];
    values[static_cast<int64_t>(blockIdx.x) * k + s] = row[id];
    ids[static_cast<int64_t>(blockIdx.x) * k + s] = id;
  }
}

}  // namespace

void LaunchTopKRows(const float* x, int64_t rows, int64_t cols, int k, float* values, int32_t* ids,
                    cudaStream_t stream) {
  if (rows == 0) return;
  TopKRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, cols, k, values, ids);
}

}  // namespace tandem::kernels::cuda
