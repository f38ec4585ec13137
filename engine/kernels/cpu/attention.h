// Causal grouped-query attention over the paged KV cache, on the CPU.
//
// For each query row and head: scores against every key at positions
// 0..position (position - window + 1..position with a sliding window) in
// position order, soft-capped if the shape says so, a softmax with the
// maximum subtracted, and the probability-weighted sum of values in position
// order. Each output
// depends only on its own query and the cached keys and values, so chunked
// and batched prefill give bitwise the same result.
//
// Over a bfloat16 cache (the bf16 mode) the products are bfloat16 dot
// products summed in float32 (attention_bf16.h), with the same guarantees.
//
// The queries that read the same keys (the heads of one KV group, and the
// rows of one sequence: a prompt chunk, or a decode token with its drafts,
// in tiles when the threads need more tasks) run as one task that converts
// each block of keys and values from halves once for all of them, and the
// vector kernels take several of its queries per load of a key. So verifying k drafted tokens costs
// little more KV traffic than decoding one, which is what makes speculation pay at long contexts.
#ifndef TANDEM_ENGINE_KERNELS_CPU_ATTENTION_H_
#define TANDEM_ENGINE_KERNELS_CPU_ATTENTION_H_

#include <cstdint>
#include <span>
#include <vector>

#include "engine/kernels/backend.h"
#include "engine/kernels/cpu/compute_pool.h"

namespace tandem::kernels::cpu {

// One layer's K and V pools: [blocks][block_size][kv_heads][head_dim]
// halves, or bfloat16 (`bf16`: the bf16 mode's cache, attention_bf16.h).
struct KvLayerView {
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  int block_size = 0;
  int kv_heads = 0;
  int head_dim = 0;
  bool bf16 = false;
};

void PagedAttention(ComputeLane& pool, std::vector<std::vector<float>>& scratch,
                    const KvLayerView& kv, const Matrix& q, const AttentionShape& shape,
                    std::span<const AttentionSpan> spans, Matrix out);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_ATTENTION_H_
