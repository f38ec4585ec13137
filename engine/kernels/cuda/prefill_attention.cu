// Tiled causal attention for prefill chunks on tensor cores (flash-attention
// style): LaunchTiledPrefillAttention in kernels.h.
//
// One thread block per (query tile, head): up to 64 consecutive query rows of
// one sequence. Its four warps own 16 rows each. For every 64 keys up to the
// tile's last position the block loads the keys and values from their pages
// into shared memory; each warp computes its 16 x 64 scores with WMMA
// (half inputs, float accumulation), masks the causal triangle, updates its
// rows' running maximum and sum, rescales its output rows and adds
// probabilities x values with WMMA again. Only a 16 x 64 score tile per warp
// is ever stored (shared memory), never the score matrix.
//
// Queries are rounded to half for the tensor cores (after the 1/sqrt(d)
// scale); the KV pages already are half. Output rows are float32. A sliding
// window starts the key loop at the tile's lowest visible key and masks each
// row's own; soft-capping rewrites the scores before the softmax.
#include <cuda_fp16.h>
#include <mma.h>

#include "engine/kernels/cuda/cuda_check.h"
#include "engine/kernels/cuda/kernels.h"

namespace tandem::kernels::cuda {
namespace {

using namespace nvcuda;

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 16;
constexpr int kTileRows = kWarps * kRowsPerWarp;  // 64 query rows
constexpr int kTileKeys = 64;
static_assert(kTileRows == kPrefillTileRows);

// Shared-memory layout for head dimension D. Row strides are padded (to
// spread banks) and keep every 16-row, 16-column fragment 32-byte aligned,
// as WMMA loads and stores need.
template <int D>
struct Smem {
  static constexpr int kHalfStride = D + 8;           // Q, K, V rows (halves)
  static constexpr int kScoreStride = kTileKeys + 4;  // S rows (floats)
  static constexpr int kProbStride = kTileKeys + 8;   // P rows (halves)
  static constexpr int kOutStride = D + 4;            // O rows (floats)
  static constexpr size_t Align(size_t bytes) { return (bytes + 127) / 128 * 128; }
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + Align(sizeof(__half) * kTileRows * kHalfStride);
  static constexpr size_t kV = kK + Align(sizeof(__half) * kTileKeys * kHalfStride);
  static constexpr size_t kS = kV + Align(sizeof(__half) * kTileKeys * kHalfStride);
  static constexpr size_t kP = kS + Align(sizeof(float) * kTileRows * kScoreStride);
  static constexpr size_t kO = kP + Align(sizeof(__half) * kTileRows * kProbStride);
  static constexpr size_t kMax = kO + Align(sizeof(float) * kTileRows * kOutStride);
  static constexpr size_t kSum = kMax + Align(sizeof(float) * kTileRows);
  static constexpr size_t kBytes = kSum + Align(sizeof(float) * kTileRows);
};

template <int D>
__global__ void __launch_bounds__(kWarps * 32) TiledPrefillKernel(AttentionArgs args) {
  using L = Smem<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* q_s = reinterpret_cast<__half*>(smem + L::kQ);
  __half* k_s = reinterpret_cast<__half*>(smem + L::kK);
  __half* v_s = reinterpret_cast<__half*>(smem + L::kV);
  float* s_s = reinterpret_cast<float*>(smem + L::kS);
  __half* p_s = reinterpret_cast<__half*>(smem + L::kP);
  float* o_s = reinterpret_cast<float*>(smem + L::kO);
  float* row_max = reinterpret_cast<float*>(smem + L::kMax);
  float* row_sum = reinterpret_cast<float*>(smem + L::kSum);

  const int32_t* tile = args.tiles + 4 * static_cast<int64_t>(blockIdx.x);
  const int64_t first_row = tile[0];
  const int rows = tile[1];
  const int first_position = tile[2];
  const int32_t* table = args.row_info + tile[3];
  const int head = blockIdx.y;
  const int kv_head = head / (args.heads / args.kv_heads);
  const int64_t q_width = static_cast<int64_t>(args.heads) * D;
  const int64_t token_stride = static_cast<int64_t>(args.kv_heads) * D;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  // The tile's queries (scaled, half; zero past its rows), a zero output and
  // empty softmax states.
  for (int i = threadIdx.x; i < kTileRows * D; i += blockDim.x) {
    const int r = i / D;
    const int d = i % D;
    const float value =
        r < rows
            ? args.q[(first_row + r) * q_width + static_cast<int64_t>(head) * D + d] * args.scale
            : 0.0f;
    q_s[r * L::kHalfStride + d] = __float2half_rn(value);
    o_s[r * L::kOutStride + d] = 0.0f;
  }
  for (int r = threadIdx.x; r < kTileRows; r += blockDim.x) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.0f;
  }

  // Each lane pair owns one of the warp's 16 rows; each lane half its keys
  // (and half its output dimensions when rescaling).
  const int my_row = warp * kRowsPerWarp + lane / 2;
  const int my_half = lane % 2;
  const bool row_valid = my_row < rows;
  const int my_position = first_position + my_row;
  const int last_key = first_position + rows - 1;
  // A sliding window: row r sees keys (position - window, position]; the
  // tile's first row sees the lowest, from a 64-key tile on.
  const int lowest_key = args.window > 0 ? max(0, first_position - args.window + 1) : 0;
  const int my_lowest = args.window > 0 ? my_position - args.window + 1 : 0;
  constexpr int kChunks = D / 8;  // 16-byte chunks of a key's row

  for (int key0 = lowest_key / kTileKeys * kTileKeys; key0 <= last_key; key0 += kTileKeys) {
    __syncthreads();  // everyone is done with the previous keys
    for (int i = threadIdx.x; i < kTileKeys * kChunks; i += blockDim.x) {
      const int k = i / kChunks;
      const int chunk = i % kChunks;
      const int key = key0 + k;
      uint4 kv_k = make_uint4(0, 0, 0, 0);
      uint4 kv_v = kv_k;
      if (key <= last_key) {
        const int64_t slot = static_cast<int64_t>(table[key / args.block_size]) * args.block_size +
                             key % args.block_size;
        const int64_t offset = slot * token_stride + static_cast<int64_t>(kv_head) * D + chunk * 8;
        kv_k = *reinterpret_cast<const uint4*>(args.k_pool + offset);
        kv_v = *reinterpret_cast<const uint4*>(args.v_pool + offset);
      }
      *reinterpret_cast<uint4*>(k_s + k * L::kHalfStride + chunk * 8) = kv_k;
      *reinterpret_cast<uint4*>(v_s + k * L::kHalfStride + chunk * 8) = kv_v;
    }
    __syncthreads();

    // Scores of this warp's rows against the 64 keys.
    float* s_w = s_s + warp * kRowsPerWarp * L::kScoreStride;
    for (int n = 0; n < kTileKeys / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int k = 0; k < D / 16; ++k) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
        wmma::load_matrix_sync(a, q_s + warp * kRowsPerWarp * L::kHalfStride + k * 16,
                               L::kHalfStride);
        // B[d][key] = K[key][d]: K's rows read column-major.
        wmma::load_matrix_sync(b, k_s + n * 16 * L::kHalfStride + k * 16, L::kHalfStride);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(s_w + n * 16, acc, L::kScoreStride, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax over this row's half of the 64 keys.
    float* s_row = s_w + (lane / 2) * L::kScoreStride;
    if (args.softcap > 0.0f) {
      for (int c = my_half * 32; c < my_half * 32 + 32; ++c) {
        s_row[c] = args.softcap * tanhf(s_row[c] / args.softcap);
      }
    }
    __half* p_row = p_s + my_row * L::kProbStride;
    float local_max = -INFINITY;
    for (int c = my_half * 32; c < my_half * 32 + 32; ++c) {
      const bool visible = row_valid && key0 + c <= my_position && key0 + c >= my_lowest;
      if (visible) local_max = fmaxf(local_max, s_row[c]);
    }
    const float tile_max = fmaxf(local_max, __shfl_xor_sync(0xffffffffu, local_max, 1));
    const float old_max = row_max[my_row];
    const float new_max = fmaxf(old_max, tile_max);
    float local_sum = 0.0f;
    for (int c = my_half * 32; c < my_half * 32 + 32; ++c) {
      const bool visible = row_valid && key0 + c <= my_position && key0 + c >= my_lowest;
      const float p = visible ? expf(s_row[c] - new_max) : 0.0f;
      local_sum += p;
      p_row[c] = __float2half_rn(p);
    }
    const float tile_sum = local_sum + __shfl_xor_sync(0xffffffffu, local_sum, 1);
    const float rescale = old_max == -INFINITY ? 0.0f : expf(old_max - new_max);
    float* o_row = o_s + my_row * L::kOutStride;
    for (int d = my_half * (D / 2); d < (my_half + 1) * (D / 2); ++d) o_row[d] *= rescale;
    __syncwarp();  // both lanes of the pair read the old state before it changes
    if (my_half == 0) {
      row_max[my_row] = new_max;
      row_sum[my_row] = row_sum[my_row] * rescale + tile_sum;
    }
    __syncwarp();

    // Output rows += probabilities x values.
    float* o_w = o_s + warp * kRowsPerWarp * L::kOutStride;
    const __half* p_w = p_s + warp * kRowsPerWarp * L::kProbStride;
    for (int j = 0; j < D / 16; ++j) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, o_w + j * 16, L::kOutStride, wmma::mem_row_major);
      for (int k = 0; k < kTileKeys / 16; ++k) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
        wmma::load_matrix_sync(a, p_w + k * 16, L::kProbStride);
        wmma::load_matrix_sync(b, v_s + k * 16 * L::kHalfStride + j * 16, L::kHalfStride);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(o_w + j * 16, acc, L::kOutStride, wmma::mem_row_major);
    }
    __syncwarp();
  }
  __syncthreads();

  for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
    const int r = i / D;
    const int d = i % D;
    const float sum = row_sum[r];
    args.out[(first_row + r) * q_width + static_cast<int64_t>(head) * D + d] =
        sum > 0.0f ? o_s[r * L::kOutStride + d] / sum : 0.0f;
  }
}

template <int D>
void Launch(const AttentionArgs& args, cudaStream_t stream) {
  constexpr size_t kBytes = Smem<D>::kBytes;
  // Above 48 KiB of dynamic shared memory a kernel must opt in (once).
  static const cudaError_t opted_in = cudaFuncSetAttribute(
      TiledPrefillKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes));
  CheckCuda(opted_in, "cudaFuncSetAttribute (tiled prefill attention's shared memory)");
  const dim3 grid(static_cast<unsigned>(args.tile_count), static_cast<unsigned>(args.heads));
  TiledPrefillKernel<D><<<grid, kWarps * 32, kBytes, stream>>>(args);
}

}  // namespace

void LaunchTiledPrefillAttention(const AttentionArgs& args, cudaStream_t stream) {
  if (args.tile_count == 0) return;
  if (args.head_dim == 64) {
    Launch<64>(args, stream);
  } else {
    Launch<128>(args, stream);
  }
}

}  // namespace tandem::kernels::cuda
