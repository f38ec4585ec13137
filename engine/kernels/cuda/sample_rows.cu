// One token per row of logits, drawn exactly as kernels::SampleRow draws it
// (LaunchSampleRows in kernels.h; the definition is sample_row.h), and the
// log-probabilities LogprobsOf gives (LaunchLogprobRows).
//
// One block per row. Everything after the weights is integer arithmetic, so
// block-wide sums in any order give the host's numbers:
//   1. the largest logit (and, for greedy rows, its lowest id: the token);
//   2. with top-k, the k-th largest rank key by radix select on counts
//      (eight 8-bit passes over the 64-bit keys of sampling_arithmetic.h);
//   3. each token's weight (0 outside the top k) into `weights`, and their
//      sum Z;
//   4. with top-p, the rank key where the ranked cumulative weight reaches
//      NucleusMass(top_p, Z), by the same radix select on weight sums; the
//      nucleus is every token ranked at or above it;
//   5. the draw: each thread sums the nucleus weight of a contiguous slice
//      of ids, a block-wide exclusive scan places the slices, and the thread
//      whose slice holds DrawTarget(u, Z_N) walks it to the token (and,
//      where asked, thread 0 writes one token's nucleus weight with Z_N).
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "engine/kernels/cuda/kernels.h"
#include "engine/kernels/sampling_arithmetic.h"

namespace tandem::kernels::cuda {
namespace {

namespace sa = ::tandem::kernels::sampling_arithmetic;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

// The better of two (value, index) candidates: larger value, then lower
// index; a NaN never beats anything (ArgMax's rule).
__device__ void Better(float& value, int32_t& index, float other_value, int32_t other_index) {
  if (other_value > value || (other_value == value && other_index < index)) {
    value = other_value;
    index = other_index;
  }
}

// The block's sum of one value per thread, returned to every thread (for
// doubles: in an order fixed by the launch shape).
template <typename T>
__device__ T BlockSum(T value, T* warp_sums) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
  return total;
}

// The block's exclusive prefix sum of one value per thread, in thread order.
__device__ uint64_t BlockExclusiveScan(uint64_t value, uint64_t* warp_sums) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t inclusive = value;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint64_t before = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += before;
  }
  __syncthreads();
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  uint64_t earlier_warps = 0;
  for (int w = 0; w < warp; ++w) earlier_warps += warp_sums[w];
  return earlier_warps + inclusive - value;
}

// The row's largest value's index, the lowest among equal ones (NaNs never
// win; a row of NaN alone gives 0), returned to every thread. The host's
// rule differs only for NaN logits, which are unsupported.
__device__ int32_t BlockArgMax(const float* row, int64_t cols) {
  __shared__ float warp_values[kWarps];
  __shared__ int32_t warp_indices[kWarps];
  __shared__ int32_t best;
  float value = -INFINITY;
  int32_t index = INT32_MAX;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    Better(value, index, row[c], static_cast<int32_t>(c));
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    Better(value, index, __shfl_xor_sync(0xffffffffu, value, offset),
           __shfl_xor_sync(0xffffffffu, index, offset));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_values[warp] = value;
    warp_indices[warp] = index;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) Better(value, index, warp_values[w], warp_indices[w]);
    best = index == INT32_MAX ? 0 : index;
  }
  __syncthreads();
  return best;
}

// Radix select over the rank keys of a row: the largest key K such that the
// amount of the elements ranked at or above K reaches `needed`. The amount
// is a count (kByCount: every element counts 1) or a weight sum (weights[c]).
// Keys are distinct, so K is one element's key.
template <bool kByCount>
__device__ uint64_t SelectRankKey(const float* row, const uint64_t* weights, int64_t cols,
                                  uint64_t needed, uint64_t* buckets, uint64_t* shared_prefix,
                                  uint64_t* shared_remaining) {
  uint64_t prefix = 0, mask = 0, remaining = needed;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) buckets[b] = 0;
    __syncthreads();
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const uint64_t amount = kByCount ? 1 : weights[c];
      if (amount == 0) continue;
      const uint64_t key = sa::RankKey(row[c], static_cast<int32_t>(c));
      if ((key & mask) == prefix) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&buckets[(key >> shift) & 0xFFu]),
                  static_cast<unsigned long long>(amount));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t above = 0;
      int bucket = 255;
      for (; bucket > 0; --bucket) {
        if (above + buckets[bucket] >= remaining) break;
        above += buckets[bucket];
      }
      *shared_prefix = prefix | (static_cast<uint64_t>(bucket) << shift);
      *shared_remaining = remaining - above;
    }
    __syncthreads();
    prefix = *shared_prefix;
    remaining = *shared_remaining;
    mask |= uint64_t{0xFF} << shift;
    __syncthreads();
  }
  return prefix;
}

// With `shares`, also share_tokens[row]'s NucleusShare (SampleRowWithShare
// in sample_row.h), written by thread 0 (-1: {0, 1}).
__global__ void __launch_bounds__(kThreads)
    SampleRowsKernel(const float* x, int64_t cols, const RowDraw* draws, uint64_t* weight_rows,
                     int32_t* tokens, const int32_t* share_tokens, NucleusShare* shares) {
  __shared__ uint64_t warp_sums[kWarps];
  __shared__ uint64_t buckets[256];
  __shared__ uint64_t shared_prefix, shared_remaining;
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  uint64_t* weights = weight_rows + static_cast<int64_t>(blockIdx.x) * cols;
  const RowDraw draw = draws[blockIdx.x];
  const int32_t share_token = shares != nullptr ? share_tokens[blockIdx.x] : -1;
  // The point mass of a greedy draw (or of a row without weights).
  auto greedy_share = [&](int32_t argmax) {
    if (shares != nullptr && threadIdx.x == 0) {
      shares[blockIdx.x] = sa::PointMassShare(argmax, share_token);
    }
  };

  // 1. The largest logit, the lowest id among equal ones.
  const int32_t token = BlockArgMax(row, cols);
  if (draw.temperature <= 0.0f || cols == 1) {
    if (threadIdx.x == 0) tokens[blockIdx.x] = token;
    greedy_share(token);
    return;
  }
  const float max = row[token];

  // 2. The top-k cut: the k-th largest rank key (0: keep everything).
  uint64_t top_k_key = 0;
  if (draw.top_k > 0 && draw.top_k < cols) {
    top_k_key = SelectRankKey<true>(row, nullptr, cols, static_cast<uint64_t>(draw.top_k), buckets,
                                    &shared_prefix, &shared_remaining);
  }

  // 3. Weights and their sum.
  const double inverse_temperature = sa::InverseTemperature(draw.temperature);
  uint64_t partial = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    uint64_t w = 0;
    if (top_k_key == 0 || sa::RankKey(row[c], static_cast<int32_t>(c)) >= top_k_key) {
      w = sa::Weight(row[c], max, inverse_temperature);
    }
    weights[c] = w;
    partial += w;
  }
  const uint64_t total = BlockSum(partial, warp_sums);  // also orders the weight writes
  if (total == 0) {  // only NaN logits get here (unsupported): SampleRow's rule
    if (threadIdx.x == 0) tokens[blockIdx.x] = token;
    greedy_share(token);
    return;
  }

  // 4. The top-p cut: the nucleus is every token ranked at or above
  //    nucleus_key (0: the weights as they are).
  uint64_t nucleus_key = 0;
  if (draw.top_p < 1.0f) {
    nucleus_key = SelectRankKey<false>(row, weights, cols, sa::NucleusMass(draw.top_p, total),
                                       buckets, &shared_prefix, &shared_remaining);
  }
  auto nucleus_weight = [&](int64_t c) -> uint64_t {
    const uint64_t w = weights[c];
    if (w == 0 || nucleus_key == 0) return w;
    return sa::RankKey(row[c], static_cast<int32_t>(c)) >= nucleus_key ? w : 0;
  };

  // 5. The draw, in id order over contiguous slices.
  const int64_t slice = (cols + kThreads - 1) / kThreads;
  const int64_t begin = threadIdx.x * slice;
  const int64_t end = begin + slice < cols ? begin + slice : cols;
  uint64_t slice_mass = 0;
  for (int64_t c = begin; c < end; ++c) slice_mass += nucleus_weight(c);
  const uint64_t nucleus_mass = BlockSum(slice_mass, warp_sums);
  if (shares != nullptr && threadIdx.x == 0) {
    shares[blockIdx.x] =
        share_token >= 0 ? NucleusShare{nucleus_weight(share_token), nucleus_mass} : NucleusShare{};
  }
  const uint64_t target = sa::DrawTarget(draw.u, nucleus_mass);
  uint64_t cumulative = BlockExclusiveScan(slice_mass, warp_sums);
  if (cumulative <= target && target < cumulative + slice_mass) {
    for (int64_t c = begin; c < end; ++c) {
      cumulative += nucleus_weight(c);
      if (cumulative > target) {
        tokens[blockIdx.x] = static_cast<int32_t>(c);
        break;
      }
    }
  }
}

// LogprobsOf (sample_row.h) per row, one block per row.
__global__ void __launch_bounds__(kThreads)
    LogprobRowsKernel(const float* x, int64_t cols, const int32_t* tokens, int top,
                      float* token_logprobs, int32_t* top_ids, float* top_logprobs) {
  __shared__ double warp_sums[kWarps];
  __shared__ uint64_t buckets[256];
  __shared__ uint64_t shared_prefix, shared_remaining;
  __shared__ uint64_t slot_keys[kMaxDeviceLogprobs];
  __shared__ int32_t slot_ids[kMaxDeviceLogprobs];
  __shared__ uint32_t taken;
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  const double max = row[BlockArgMax(row, cols)];
  double partial = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    partial += exp(static_cast<double>(row[c]) - max);
  }
  const double log_z = max + log(BlockSum(partial, warp_sums));
  if (threadIdx.x == 0) {
    token_logprobs[blockIdx.x] = static_cast<float>(row[tokens[blockIdx.x]] - log_z);
    taken = 0;
  }
  if (top == 0) return;
  const uint64_t last = SelectRankKey<true>(row, nullptr, cols, static_cast<uint64_t>(top), buckets,
                                            &shared_prefix, &shared_remaining);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const uint64_t key = sa::RankKey(row[c], static_cast<int32_t>(c));
    if (key >= last) {
      const uint32_t slot = atomicAdd(&taken, 1u);
      slot_keys[slot] = key;
      slot_ids[slot] = static_cast<int32_t>(c);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // at most kMaxDeviceLogprobs: insertion sort, rank order
    for (int i = 1; i < top; ++i) {
      const uint64_t key = slot_keys[i];
      const int32_t id = slot_ids[i];
      int j = i;
      for (; j > 0 && slot_keys[j - 1] < key; --j) {
        slot_keys[j] = slot_keys[j - 1];
        slot_ids[j] = slot_ids[j - 1];
      }
      slot_keys[j] = key;
      slot_ids[j] = id;
    }
    for (int i = 0; i < top; ++i) {
      const int64_t out = static_cast<int64_t>(blockIdx.x) * top + i;
      top_ids[out] = slot_ids[i];
      top_logprobs[out] = static_cast<float>(row[slot_ids[i]] - log_z);
    }
  }
}

}  // namespace

void LaunchLogprobRows(const float* x, int64_t rows, int64_t cols, const int32_t* tokens, int top,
                       float* token_logprobs, int32_t* top_ids, float* top_logprobs,
                       cudaStream_t stream) {
  if (rows == 0) return;
  LogprobRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      x, cols, tokens, top, token_logprobs, top_ids, top_logprobs);
}

void LaunchSampleRows(const float* x, int64_t rows, int64_t cols, const RowDraw* draws,
                      uint64_t* weights, int32_t* tokens, const int32_t* share_tokens,
                      NucleusShare* shares, cudaStream_t stream) {
  if (rows == 0) return;
  SampleRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      x, cols, draws, weights, tokens, share_tokens, shares);
}

}  // namespace tandem::kernels::cuda
