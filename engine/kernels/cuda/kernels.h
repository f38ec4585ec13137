// Launchers of the CUDA backend's own kernels (elementwise.cu, attention.cu).
//
// Plain C++ (no CUDA syntax), so the host code that calls them compiles with
// the C++ compiler. Every pointer is device memory unless named `host`; every
// launch is asynchronous on `stream`. Matrices are row-major and contiguous
// (row r of a [rows][cols] matrix starts at r * cols), activations float32,
// KV pages IEEE half floats laid out as backend.h's KvStorage says.
#ifndef TANDEM_ENGINE_KERNELS_CUDA_KERNELS_H_
#define TANDEM_ENGINE_KERNELS_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/kernels/sampling_arithmetic.h"

namespace tandem::kernels::cuda {

// out[i] = row ids[i] of a [*][cols] table stored as bf16 (or float32).
void LaunchEmbedBf16(const uint16_t* table, int64_t cols, const int32_t* ids, int64_t rows,
                     float* out, cudaStream_t stream);
void LaunchEmbedF32(const float* table, int64_t cols, const int32_t* ids, int64_t rows, float* out,
                    cudaStream_t stream);

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight. out may alias x.
void LaunchRmsNorm(const float* x, const float* weight, int64_t rows, int64_t cols, float eps,
                   float* out, cudaStream_t stream);
// acc += x, then out = RmsNorm(acc); one pass per row. out may alias x.
void LaunchAddRmsNorm(float* acc, const float* x, const float* weight, int64_t rows, int64_t cols,
                      float eps, float* out, cudaStream_t stream);

// What the rotary kernels need to know (backend.h's RopeSpec on the device).
struct RopeArgs {
  const float* table = nullptr;  // [position][rotary_dims / 2][cos, sin]
  int rotary_dims = 0;
  bool neox = false;
};
// Rotates, in place, `heads` heads of head_dim of every row of x by
// positions[row].
void LaunchRope(float* x, int64_t rows, int heads, int head_dim, const int32_t* positions,
                const RopeArgs& rope, cudaStream_t stream);
// Rotates q's and k's heads, then stores row r of k and v as halves into KV
// slot slots[r] of the pools ([slot][kv_heads * head_dim]); a slot of -1
// stores nothing (here and in LaunchWriteKv).
void LaunchRopeWriteKv(float* q, float* k, const float* v, int64_t rows, int heads, int kv_heads,
                       int head_dim, const int32_t* positions, const int32_t* slots,
                       const RopeArgs& rope, uint16_t* k_pool, uint16_t* v_pool,
                       cudaStream_t stream);
// Stores row r of k and v (width floats each) into slot slots[r].
void LaunchWriteKv(const float* k, const float* v, int64_t rows, int64_t width,
                   const int32_t* slots, uint16_t* k_pool, uint16_t* v_pool, cudaStream_t stream);
// Copies `halves` halves at each of `pools` pool starts (pool p at
// base + p * pool_stride) from offset `from` to offset `to`.
void LaunchCopyKvBlock(uint16_t* base, int pools, int64_t pool_stride, int64_t from, int64_t to,
                       int64_t halves, cudaStream_t stream);

// out[i] = silu(gate[i]) * up[i] for n elements.
void LaunchSiluMul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream);
// out[i] = gelu(gate[i]) * up[i] for n elements (GELU's tanh form).
void LaunchGeluMul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream);
// x[i] *= factor for n elements.
void LaunchScale(float* x, int64_t n, float factor, cudaStream_t stream);
// x[i] = cap * tanh(x[i] / cap) for n elements.
void LaunchSoftcap(float* x, int64_t n, float cap, cudaStream_t stream);
// acc[rows[i]] += weights[i] * x[i] for n rows of `cols` (distinct rows).
void LaunchScatterAddRows(float* acc, const float* x, int64_t cols, const int32_t* rows,
                          const float* weights, int64_t n, cudaStream_t stream);
// acc[i] += x[i] for n elements.
void LaunchAdd(float* acc, const float* x, int64_t n, cudaStream_t stream);
// out[r] += bias for every row of a [rows][cols] matrix.
void LaunchAddBias(float* out, int64_t rows, int64_t cols, const float* bias, cudaStream_t stream);
// out[i] = x[rows[i]] for n rows of cols floats.
void LaunchGatherRows(const float* x, int64_t cols, const int32_t* rows, int64_t n, float* out,
                      cudaStream_t stream);
// out[r] = the index of row r's largest value, the lowest among equal ones
// (NaNs never win), for a [rows][cols] matrix.
void LaunchArgMaxRows(const float* x, int64_t rows, int64_t cols, int32_t* out,
                      cudaStream_t stream);
// tokens[r] = kernels::SampleRow(row r, draws[r]) bit for bit (sample_row.h;
// NaN logits unsupported). `weights` is [rows][cols] scratch. With `shares`
// (else null, as share_tokens), also shares[r] = share_tokens[r]'s share as
// SampleRowWithShare gives it ({0, 1} where share_tokens[r] is -1).
// REQUIRES cols <= sampling_arithmetic::kMaxVocabulary.
void LaunchSampleRows(const float* x, int64_t rows, int64_t cols, const RowDraw* draws,
                      uint64_t* weights, int32_t* tokens, const int32_t* share_tokens,
                      NucleusShare* shares, cudaStream_t stream);
// kernels::LogprobsOf(row r, tokens[r], top) per row (token_logprobs [rows],
// top_ids and top_logprobs [rows][top]): ids exact, values summed in another
// order. REQUIRES 0 <= top <= min(cols, kMaxDeviceLogprobs).
inline constexpr int kMaxDeviceLogprobs = 32;
void LaunchLogprobRows(const float* x, int64_t rows, int64_t cols, const int32_t* tokens, int top,
                       float* token_logprobs, int32_t* top_ids, float* top_logprobs,
                       cudaStream_t stream);
// out[i] = bf16(x[i]) (round to nearest even) for n elements.
void LaunchToBf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream);

// Causal grouped-query attention over paged KV, never storing a score
// matrix. Rows in query tiles (prefill chunks; attention_rows.h) go to a
// tiled flash-attention kernel on tensor cores (prefill_attention.cu); the
// others to a per-row online softmax whose keys may be split over `splits`
// blocks merged by a second kernel (flash-decoding; attention.cu).
struct AttentionArgs {
  const float* q = nullptr;  // [rows][heads * head_dim]
  float* out = nullptr;      // [rows][heads * head_dim]
  const uint16_t* k_pool = nullptr;
  const uint16_t* v_pool = nullptr;
  // attention_rows.h's layout: [rows] table offsets, [rows] key counts, tables.
  const int32_t* row_info = nullptr;
  int64_t rows = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;  // a multiple of 32, at most 256
  int block_size = 0;
  float scale = 0.0f;
  int window = 0;        // AttentionShape::window: a row sees keys > position - window
  float softcap = 0.0f;  // AttentionShape::softcap
  int splits = 1;
  int max_keys = 0;  // the largest key count of any row
  // splits * rows * heads * (head_dim + 2) floats when splits > 1.
  float* partial = nullptr;
  // Query tiles (4 words each, attention_rows.h), for head_dim 64 or 128.
  const int32_t* tiles = nullptr;
  int tile_count = 0;
};
void LaunchPagedAttention(const AttentionArgs& args, cudaStream_t stream);
// The tiled kernel alone (LaunchPagedAttention calls it).
void LaunchTiledPrefillAttention(const AttentionArgs& args, cudaStream_t stream);
// Query tiles hold this many rows; head dimensions the tiled kernel has.
inline constexpr int kPrefillTileRows = 64;
inline bool TiledPrefillSupports(int head_dim) { return head_dim == 64 || head_dim == 128; }

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_ENGINE_KERNELS_CUDA_KERNELS_H_
