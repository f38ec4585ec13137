#include "engine/kernels/cpu/attention.h"

#include <algorithm>
#include <cstring>

#include "engine/kernels/cpu/simd.h"

namespace tandem::kernels::cpu {
namespace {

// q (head_dim floats) . k (head_dim halves), in a fixed order.
inline float DotQK(const float* q, const uint16_t* k, int head_dim) {
  int i = 0;
  float sum = 0.0f;
#ifdef TANDEM_CPU_AVX2
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  for (; i + 16 <= head_dim; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), LoadHalf8(k + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), LoadHalf8(k + i + 8), acc1);
  }
  sum = HorizontalSum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < head_dim; ++i) sum += q[i] * HalfToFloat(k[i]);
  return sum;
}

// acc[0..head_dim) += p * v, elementwise.
inline void AccumulateV(float* acc, float p, const uint16_t* v, int head_dim) {
  int i = 0;
#ifdef TANDEM_CPU_AVX2
  const __m256 pv = _mm256_set1_ps(p);
  for (; i + 8 <= head_dim; i += 8) {
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(pv, LoadHalf8(v + i), _mm256_loadu_ps(acc + i)));
  }
#endif
  for (; i < head_dim; ++i) acc[i] += p * HalfToFloat(v[i]);
}

// Replaces scores[0..n) by exp(scores - max) and returns their sum.
float ExpAndSum(float* scores, int64_t n) {
  float max = scores[0];
  for (int64_t j = 1; j < n; ++j) max = std::max(max, scores[j]);
  int64_t j = 0;
  float sum = 0.0f;
#ifdef TANDEM_CPU_AVX2
  const __m256 vmax = _mm256_set1_ps(max);
  __m256 vsum = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), vmax));
    _mm256_storeu_ps(scores + j, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  sum = HorizontalSum(vsum);
#endif
  for (; j < n; ++j) {
    scores[j] = ExpApprox(scores[j] - max);
    sum += scores[j];
  }
  return sum;
}

}  // namespace

void PagedAttention(ThreadPool& pool, std::vector<std::vector<float>>& scratch,
                    const KvLayerView& kv, const Matrix& q, const AttentionShape& shape,
                    std::span<const AttentionSpan> spans, Matrix out) {
  const int head_dim = shape.head_dim;
  const int group = shape.heads / shape.kv_heads;
  const int64_t token_stride = int64_t{kv.kv_heads} * head_dim;  // halves per token slot
  const int64_t block_stride = token_stride * kv.block_size;
  scratch.resize(static_cast<size_t>(pool.size()));

  // Tasks: (query row, head). Rows are numbered by their span in order.
  int64_t total_rows = 0;
  for (const AttentionSpan& s : spans) total_rows += s.rows;
  std::vector<int32_t> span_of_row(static_cast<size_t>(total_rows));
  {
    int64_t i = 0;
    for (size_t s = 0; s < spans.size(); ++s) {
      for (int32_t r = 0; r < spans[s].rows; ++r) span_of_row[static_cast<size_t>(i++)] = s;
    }
  }
  std::vector<int64_t> first_index(spans.size(), 0);
  for (size_t s = 1; s < spans.size(); ++s) first_index[s] = first_index[s - 1] + spans[s - 1].rows;

  pool.ParallelFor(total_rows * shape.heads, [&](int64_t task, int thread) {
    const int64_t flat_row = task / shape.heads;
    const int head = static_cast<int>(task % shape.heads);
    const AttentionSpan& span =
        spans[static_cast<size_t>(span_of_row[static_cast<size_t>(flat_row)])];
    const int32_t offset = static_cast<int32_t>(flat_row - first_index[span_of_row[flat_row]]);
    const int64_t row = span.first_row + offset;
    const int64_t position = span.first_position + offset;
    const int64_t keys = position + 1;
    const int kv_head = head / group;

    std::vector<float>& scores = scratch[static_cast<size_t>(thread)];
    scores.resize(static_cast<size_t>(keys) + static_cast<size_t>(head_dim));
    const float* qh = q.Row(row) + int64_t{head} * head_dim;

    for (int64_t j = 0; j < keys; ++j) {
      const int64_t block = span.block_table[static_cast<size_t>(j / kv.block_size)];
      const uint16_t* k = kv.k + block * block_stride + (j % kv.block_size) * token_stride +
                          int64_t{kv_head} * head_dim;
      scores[static_cast<size_t>(j)] = DotQK(qh, k, head_dim) * shape.scale;
    }
    const float sum = ExpAndSum(scores.data(), keys);

    float* acc = out.Row(row) + int64_t{head} * head_dim;
    std::memset(acc, 0, sizeof(float) * static_cast<size_t>(head_dim));
    for (int64_t j = 0; j < keys; ++j) {
      const int64_t block = span.block_table[static_cast<size_t>(j / kv.block_size)];
      const uint16_t* v = kv.v + block * block_stride + (j % kv.block_size) * token_stride +
                          int64_t{kv_head} * head_dim;
      AccumulateV(acc, scores[static_cast<size_t>(j)], v, head_dim);
    }
    const float inverse = 1.0f / sum;
    for (int i = 0; i < head_dim; ++i) acc[i] *= inverse;
  });
}

}  // namespace tandem::kernels::cpu
