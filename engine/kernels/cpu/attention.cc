#include "engine/kernels/cpu/attention.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "engine/kernels/cpu/attention_bf16.h"
#include "engine/kernels/cpu/elementwise.h"
#include "engine/kernels/cpu/simd.h"

// GCC 12 reports the undefined pass-through operand inside AVX-512
// intrinsics (_mm512_undefined_ps) as maybe-uninitialized once they are
// inlined (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tandem::kernels::cpu {
namespace {

// Keys converted from halves to floats at a time (their K or V rows stay in
// L1 while every query of the task uses them).
constexpr int kKeyBlock = 64;
// Query rows of one sequence per task at most (a prefill chunk is split;
// PagedAttention splits a verification's rows into tiles of 8 or 4 when
// there would otherwise be too few tasks for the threads).
constexpr int kRowTile = 16;
// Tasks with at most this many queries read K and V as halves in place
// (converting them first cost a decode batch of 32 a fifth of its time; with
// queries grouped to share each row's conversion, in place stays cheaper up
// to 8 queries, tandem-attention-bench at 5-8 rows); larger ones convert
// each block once for all their queries.
constexpr int kInPlaceMaxQueries = 8;
#ifdef TANDEM_CPU_AVX2
constexpr bool kInPlaceSupported = true;
#else
constexpr bool kInPlaceSupported = false;
#endif

// One task: the query rows [row_begin, row_end) of one span (sequence), for
// the query heads [head_begin, head_end) that share one KV head. Every query
// of the task reads the same keys and values, converted once.
struct Task {
  int32_t span;
  int32_t kv_head;
  int32_t head_begin, head_end;
  int32_t row_begin, row_end;
  // Over a bfloat16 cache, keys go in chunks of kKeyChunk (RunBf16Task):
  // this task takes chunks [chunk_begin, chunk_end) of its queries' chunks
  // [group_chunk, group_chunk + group_chunks). A task with all of them
  // combines them itself; the parts of a split group write their partial
  // sums at `partials` in the call's buffer, combined after all have run.
  int64_t chunk_begin = 0, chunk_end = 0;
  int64_t group_chunk = 0, group_chunks = 0;
  int64_t partials = -1;  // -1: the task has all its group's chunks
};

// A query's partial result over one chunk of keys: the chunk's maximum
// score, the sum of its softmax numerators (0: the query sees no key of
// the chunk) and its value sums, head_dim floats, in that order.
inline size_t PartialFloats(int head_dim) { return static_cast<size_t>(head_dim) + 2; }

// The floats of a task's partials: [query][chunk of its group].
inline size_t TaskPartialFloats(const Task& task, int head_dim) {
  return static_cast<size_t>(task.head_end - task.head_begin) *
         static_cast<size_t>(task.row_end - task.row_begin) *
         static_cast<size_t>(task.group_chunks) * PartialFloats(head_dim);
}

// Keys per chunk of a bfloat16 cache's attention: each query's softmax runs
// over each chunk on its own (its maximum, its sum, its value sums), and
// the chunks are then combined in order, so a long context can be split
// between threads at chunk boundaries without changing any bit.
constexpr int64_t kKeyChunk = 256;

// The head sizes with vector kernels (64: SmolLM2, Llama 3.2 1B; 128: most
// models from 1.5B up; 256: Gemma). A head of kDim dimensions is kDim / 8
// chunks of eight.
inline bool HasVectorKernels(int head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

#ifdef TANDEM_CPU_AVX2
// Eight lanes of a key or value row, from floats or (exactly converted) halves.
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const uint16_t* p) { return LoadHalf8(p); }

// The eight lanes whose sum (HorizontalSum) is q . k: two chains of
// products, over the even and the odd chunks, added lane by lane.
template <int kDim, typename T>
inline __m256 DotLanes(const __m256* q, const T* k) {
  __m256 acc0 = _mm256_mul_ps(q[0], Load8(k));
  __m256 acc1 = _mm256_mul_ps(q[1], Load8(k + 8));
  for (int c = 2; c < kDim / 8; c += 2) {
    acc0 = _mm256_fmadd_ps(q[c], Load8(k + 8 * c), acc0);
    acc1 = _mm256_fmadd_ps(q[c + 1], Load8(k + 8 * c + 8), acc1);
  }
  return _mm256_add_ps(acc0, acc1);
}

// scores[j] = scale * (q . rows[j]) for j in [0, n). The same operations
// whether the rows are floats or halves (converted exactly), and whether a
// key falls in a group of eight or not, so a query's scores do not depend
// on which form its task reads or on how many keys it sees.
template <int kDim, typename T>
void ScoreRows(const float* q, const T* const* rows, int n, float scale, float* scores) {
  __m256 qv[kDim / 8];
  for (int i = 0; i < kDim / 8; ++i) qv[i] = _mm256_loadu_ps(q + 8 * i);
  const __m256 vscale = _mm256_set1_ps(scale);
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 lanes[8];
    for (int i = 0; i < 8; ++i) lanes[i] = DotLanes<kDim>(qv, rows[j + i]);
    _mm256_storeu_ps(scores + j, _mm256_mul_ps(HorizontalSums8(lanes), vscale));
  }
  for (; j < n; ++j) scores[j] = HorizontalSum(DotLanes<kDim>(qv, rows[j])) * scale;
}

// acc[0..kDim) += p[j] * rows[j] for j in [0, n), in order of j.
template <int kDim, typename T>
void AccumulateRows(float* acc, const float* p, const T* const* rows, int n) {
  __m256 a[kDim / 8];
  for (int i = 0; i < kDim / 8; ++i) a[i] = _mm256_loadu_ps(acc + 8 * i);
  for (int j = 0; j < n; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    for (int i = 0; i < kDim / 8; ++i) a[i] = _mm256_fmadd_ps(pj, Load8(rows[j] + 8 * i), a[i]);
  }
  for (int i = 0; i < kDim / 8; ++i) _mm256_storeu_ps(acc + 8 * i, a[i]);
}

using bf16_attention::WithHeadDim;  // REQUIRES: HasVectorKernels(head_dim)
#endif

#ifdef TANDEM_CPU_AVX512
// The same kernels with 16-lane vectors, for several queries at once that
// share each key's (or value's) loads and conversion. Every query's
// arithmetic is the 8-lane kernels' (so bitwise equal to them, and to
// itself whatever queries it runs with): a 16-lane chunk of dimensions
// [16c, 16c + 16) holds DotLanes's acc0 chain in its low half and acc1's
// in its high half, and value accumulation is element-wise.
inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 Load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// DotLanes<kDim>(q, k) for a key loaded as k[0..kDim / 16): acc0 + acc1.
template <int kDim>
inline __m256 DotLanes(const __m512* q, const __m512* k) {
  __m512 acc = _mm512_mul_ps(q[0], k[0]);
  for (int c = 1; c < kDim / 16; ++c) acc = _mm512_fmadd_ps(q[c], k[c], acc);
  const __m256 high = _mm512_castps512_ps256(_mm512_shuffle_f32x4(acc, acc, 0xEE));
  return _mm256_add_ps(_mm512_castps512_ps256(acc), high);
}

// A key or value row as kDim / 16 vectors.
template <int kDim, typename T>
inline void LoadRow(const T* row, __m512* v) {
  for (int c = 0; c < kDim / 16; ++c) v[c] = Load16(row + 16 * c);
}

// ScoreRows for NQ queries: scores[b][j] = scale * (q[b] . rows[j]).
template <int NQ, int kDim, typename T>
void ScoreRowsMulti(const float* const* q, const T* const* rows, int n, float scale,
                    float* const* scores) {
  __m512 qv[NQ][kDim / 16];
  for (int b = 0; b < NQ; ++b) {
    for (int c = 0; c < kDim / 16; ++c) qv[b][c] = _mm512_loadu_ps(q[b] + 16 * c);
  }
  const __m256 vscale = _mm256_set1_ps(scale);
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 lanes[NQ][8];
    for (int i = 0; i < 8; ++i) {
      __m512 k[kDim / 16];
      LoadRow<kDim>(rows[j + i], k);
      for (int b = 0; b < NQ; ++b) lanes[b][i] = DotLanes<kDim>(qv[b], k);
    }
    for (int b = 0; b < NQ; ++b) {
      _mm256_storeu_ps(scores[b] + j, _mm256_mul_ps(HorizontalSums8(lanes[b]), vscale));
    }
  }
  for (; j < n; ++j) {
    __m512 k[kDim / 16];
    LoadRow<kDim>(rows[j], k);
    for (int b = 0; b < NQ; ++b) scores[b][j] = HorizontalSum(DotLanes<kDim>(qv[b], k)) * scale;
  }
}

// AccumulateRows for NQ queries: acc[b] += p[b][j] * rows[j], in order of j.
template <int NQ, int kDim, typename T>
void AccumulateRowsMulti(float* const* acc, const float* const* p, const T* const* rows, int n) {
  __m512 a[NQ][kDim / 16];
  for (int b = 0; b < NQ; ++b) {
    for (int c = 0; c < kDim / 16; ++c) a[b][c] = _mm512_loadu_ps(acc[b] + 16 * c);
  }
  for (int j = 0; j < n; ++j) {
    __m512 v[kDim / 16];
    LoadRow<kDim>(rows[j], v);
    for (int b = 0; b < NQ; ++b) {
      const __m512 pj = _mm512_set1_ps(p[b][j]);
      for (int c = 0; c < kDim / 16; ++c) a[b][c] = _mm512_fmadd_ps(pj, v[c], a[b][c]);
    }
  }
  for (int b = 0; b < NQ; ++b) {
    for (int c = 0; c < kDim / 16; ++c) _mm512_storeu_ps(acc[b] + 16 * c, a[b][c]);
  }
}
#endif

// scores[j] = scale * (q . keys[j]) for j in [0, n), keys rows of head_dim
// floats. The dot product is DotF32's, in the same order for every query,
// whatever the task holds (so results do not depend on batching).
void ScoreBlock(const float* q, const float* keys, int n, int head_dim, float scale,
                float* scores) {
#ifdef TANDEM_CPU_AVX2
  if (HasVectorKernels(head_dim)) {
    const float* rows[kKeyBlock];
    for (int j = 0; j < n; ++j) rows[j] = keys + int64_t{j} * head_dim;
    WithHeadDim(head_dim, [&](auto dim) { ScoreRows<dim()>(q, rows, n, scale, scores); });
    return;
  }
#endif
  for (int j = 0; j < n; ++j) {
    scores[j] = DotF32(q, keys + int64_t{j} * head_dim, head_dim) * scale;
  }
}

// acc[0..head_dim) += p[j] * values[j] for j in [0, n), in order of j.
void AccumulateBlock(float* acc, const float* p, const float* values, int n, int head_dim) {
#ifdef TANDEM_CPU_AVX2
  if (HasVectorKernels(head_dim)) {
    const float* rows[kKeyBlock];
    for (int j = 0; j < n; ++j) rows[j] = values + int64_t{j} * head_dim;
    WithHeadDim(head_dim, [&](auto dim) { AccumulateRows<dim()>(acc, p, rows, n); });
    return;
  }
#endif
  for (int j = 0; j < n; ++j) {
    const float* v = values + int64_t{j} * head_dim;
    int i = 0;
#ifdef TANDEM_CPU_AVX2
    const __m256 pj = _mm256_set1_ps(p[j]);
    for (; i + 8 <= head_dim; i += 8) {
      _mm256_storeu_ps(acc + i,
                       _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
    }
#endif
    for (; i < head_dim; ++i) acc[i] += p[j] * v[i];
  }
}

// Replaces scores[0..n) by exp(scores - max) and returns their sum.
float ExpAndSum(float* scores, int64_t n) {
  // The maximum is exact in any order.
  float max = scores[0];
  int64_t j = 0;
#ifdef TANDEM_CPU_AVX2
  if (n >= 8) {
    __m256 vmax8 = _mm256_loadu_ps(scores);
    for (j = 8; j + 8 <= n; j += 8) vmax8 = _mm256_max_ps(vmax8, _mm256_loadu_ps(scores + j));
    max = HorizontalMax(vmax8);
  }
#endif
  for (; j < n; ++j) max = std::max(max, scores[j]);
  j = 0;
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

// Converts the K or V rows of keys [first, first + n) of one KV head to
// floats. (Walks the block table with counters: a division per key costs
// more than converting it.)
void ConvertBlock(const uint16_t* pool, const KvLayerView& kv, std::span<const int32_t> table,
                  int kv_head, int64_t first, int n, float* out) {
  const int64_t token_stride = int64_t{kv.kv_heads} * kv.head_dim;
  const int64_t block_stride = token_stride * kv.block_size;
  size_t block = static_cast<size_t>(first / kv.block_size);
  int slot = static_cast<int>(first % kv.block_size);
  const uint16_t* src =
      pool + table[block] * block_stride + slot * token_stride + int64_t{kv_head} * kv.head_dim;
  for (int j = 0; j < n; ++j) {
    float* dst = out + int64_t{j} * kv.head_dim;
    int i = 0;
#ifdef TANDEM_CPU_AVX2
    for (; i + 8 <= kv.head_dim; i += 8) _mm256_storeu_ps(dst + i, LoadHalf8(src + i));
#endif
    for (; i < kv.head_dim; ++i) dst[i] = HalfToFloat(src[i]);
    if (++slot < kv.block_size) {
      src += token_stride;
    } else if (j + 1 < n) {
      slot = 0;
      src = pool + table[++block] * block_stride + int64_t{kv_head} * kv.head_dim;
    }
  }
}

// rows[j] = the K or V row (16-bit floats: halves, or bfloat16 in the bf16
// mode) of key first + j of one KV head.
void HalfRows(const uint16_t* pool, const KvLayerView& kv, std::span<const int32_t> table,
              int kv_head, int64_t first, int n, const uint16_t** rows) {
  const int64_t token_stride = int64_t{kv.kv_heads} * kv.head_dim;
  const int64_t block_stride = token_stride * kv.block_size;
  const uint16_t* head = pool + int64_t{kv_head} * kv.head_dim;
  // Walks the block table with counters, as ConvertBlock does.
  size_t block = static_cast<size_t>(first / kv.block_size);
  int slot = static_cast<int>(first % kv.block_size);
  const uint16_t* block_start = head + table[block] * block_stride;
  for (int j = 0; j < n; ++j) {
    rows[j] = block_start + slot * token_stride;
    if (++slot == kv.block_size && j + 1 < n) {
      slot = 0;
      block_start = head + table[++block] * block_stride;
    }
  }
}

// The queries of one task: query i = (row r, head h) with i = r * heads + h.
struct TaskQueries {
  std::vector<const float*> q;  // its query vector
  std::vector<float*> scores;   // its scores (then probabilities) over keys [0, keys)
  std::vector<float*> out;      // its output row
  std::vector<int64_t> keys;    // keys it sees: [0, position + 1)
  std::vector<float> sums;      // its softmax denominator

  void clear() {
    q.clear();
    scores.clear();
    out.clear();
    keys.clear();
    sums.clear();
  }
};

#ifdef TANDEM_CPU_AVX512
// Queries scored together (two heads of 64 keep their products and lane
// sums in registers) and accumulated together (four heads of 64, two of
// 128, keep 16 accumulators); one at a time for larger heads.
template <int kDim>
constexpr int kScoreGroup = kDim == 64 ? 2 : 1;
template <int kDim>
constexpr int kAccumulateGroup = kDim <= 128 ? 256 / kDim : 1;

// Runs kernel(begin, count, offset, many) over `queries` queries, of which
// query i has units(i) units (keys or key pairs) of a block to go:
// consecutive queries in groups of `group` jointly over the units they all
// have, then each alone over the rest of its own (a query's arithmetic does
// not depend on which way a key is reached).
template <int group, typename Units, typename Kernel>
void ForQueryGroupsOf(int queries, Units units, Kernel kernel) {
  for (int begin = 0; begin < queries; begin += group) {
    const int count = std::min(group, queries - begin);
    int common = std::numeric_limits<int>::max();
    for (int b = 0; b < count; ++b) common = std::min(common, units(begin + b));
    if (count == group && common > 0) {
      kernel(begin, group, 0, common);
    } else {
      common = 0;
    }
    for (int b = 0; b < count; ++b) {
      const int rest = units(begin + b) - common;
      if (rest > 0) kernel(begin + b, 1, common, rest);
    }
  }
}

// ForQueryGroupsOf over the keys of the block [first, first + n) each query sees.
template <int group, typename Kernel>
void ForQueryGroups(const TaskQueries& tq, int64_t first, int n, Kernel kernel) {
  ForQueryGroupsOf<group>(
      static_cast<int>(tq.keys.size()),
      [&](int i) {
        return static_cast<int>(std::clamp<int64_t>(tq.keys[static_cast<size_t>(i)] - first, 0, n));
      },
      kernel);
}

template <int kDim, typename T>
void ScoreQueries(const TaskQueries& tq, const T* const* rows, int64_t first, int n, float scale) {
  constexpr int kGroup = kScoreGroup<kDim>;
  ForQueryGroups<kGroup>(tq, first, n, [&](int begin, int count, int offset, int keys) {
    float* scores[kGroup];
    for (int b = 0; b < count; ++b) {
      scores[b] = tq.scores[static_cast<size_t>(begin + b)] + first + offset;
    }
    const float* const* q = &tq.q[static_cast<size_t>(begin)];
    if (count == kGroup) {
      ScoreRowsMulti<kGroup, kDim>(q, rows + offset, keys, scale, scores);
    } else {
      ScoreRowsMulti<1, kDim>(q, rows + offset, keys, scale, scores);
    }
  });
}

template <int kDim, typename T>
void AccumulateQueries(const TaskQueries& tq, const T* const* rows, int64_t first, int n) {
  constexpr int kGroup = kAccumulateGroup<kDim>;
  ForQueryGroups<kGroup>(tq, first, n, [&](int begin, int count, int offset, int keys) {
    const float* p[kGroup];
    for (int b = 0; b < count; ++b) {
      p[b] = tq.scores[static_cast<size_t>(begin + b)] + first + offset;
    }
    float* const* acc = &tq.out[static_cast<size_t>(begin)];
    if (count == kGroup) {
      AccumulateRowsMulti<kGroup, kDim>(acc, p, rows + offset, keys);
    } else {
      AccumulateRowsMulti<1, kDim>(acc, p, rows + offset, keys);
    }
  });
}
#endif

#ifdef TANDEM_CPU_BF16_ATTENTION
// The words of one KV head in block `block` of a bfloat16 pool
// (attention_bf16.h's layout).
inline const uint16_t* HeadInBlock(const uint16_t* pool, const KvLayerView& kv, int32_t block,
                                   int kv_head) {
  return pool + bf16_attention::HeadOffset(block, kv_head, kv.kv_heads, kv.block_size, kv.head_dim);
}

// tiles[t] = the key tile of keys [first + 16 t, first + 16 t + 16) of one
// KV head, for t < n; `first` a multiple of 16.
void KeyTiles(const KvLayerView& kv, std::span<const int32_t> table, int kv_head, int64_t first,
              int n, const uint16_t** tiles) {
  constexpr int kTile = bf16_attention::kTileKeys;
  for (int t = 0; t < n; ++t) {
    const int64_t key = first + int64_t{kTile} * t;
    tiles[t] = HeadInBlock(kv.k, kv, table[static_cast<size_t>(key / kv.block_size)], kv_head) +
               (key % kv.block_size) * kv.head_dim;
  }
}

// pairs[i] = the value pair of keys (first + 2i, first + 2i + 1) of one KV
// head, for i < n; `first` even.
void ValuePairs(const KvLayerView& kv, std::span<const int32_t> table, int kv_head, int64_t first,
                int n, const uint16_t** pairs) {
  size_t block = static_cast<size_t>(first / kv.block_size);
  int slot = static_cast<int>(first % kv.block_size);
  const uint16_t* head = HeadInBlock(kv.v, kv, table[block], kv_head);
  for (int i = 0; i < n; ++i) {
    pairs[i] = head + slot * kv.head_dim;  // a pair is 2 x head_dim words
    slot += 2;
    if (slot == kv.block_size && i + 1 < n) {
      slot = 0;
      head = HeadInBlock(kv.v, kv, table[++block], kv_head);
    }
  }
}

// Calls fn(std::integral_constant<int, n>{}) for n in [1, 4].
template <typename Fn>
inline void WithTileCount(int n, Fn&& fn) {
  if (n == 4) return fn(std::integral_constant<int, 4>{});
  if (n == 3) return fn(std::integral_constant<int, 3>{});
  if (n == 2) return fn(std::integral_constant<int, 2>{});
  return fn(std::integral_constant<int, 1>{});
}

// out[0..kDim) = the softmax-weighted value sum from a query's partials
// over `chunks` chunks in order: each chunk weighted by exp(its maximum -
// the largest), the weighted value sums and numerator sums added chunk by
// chunk, then divided.
template <int kDim>
void CombineChunks(const float* partials, int64_t chunks, float* out) {
  const size_t stride = PartialFloats(kDim);
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < chunks; ++c) {
    const float* part = partials + static_cast<size_t>(c) * stride;
    if (part[1] > 0.0f) max = std::max(max, part[0]);
  }
  __m512 acc[kDim / 16];
  for (int d = 0; d < kDim / 16; ++d) acc[d] = _mm512_setzero_ps();
  float sum = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) {
    const float* part = partials + static_cast<size_t>(c) * stride;
    if (part[1] == 0.0f) continue;
    const float weight = ExpApprox(part[0] - max);
    sum = std::fma(weight, part[1], sum);
    const __m512 w = _mm512_set1_ps(weight);
    for (int d = 0; d < kDim / 16; ++d) {
      acc[d] = _mm512_fmadd_ps(w, _mm512_loadu_ps(part + 2 + 16 * d), acc[d]);
    }
  }
  const __m512 inverse = _mm512_set1_ps(1.0f / sum);
  for (int d = 0; d < kDim / 16; ++d)
    _mm512_storeu_ps(out + 16 * d, _mm512_mul_ps(acc[d], inverse));
}

// CombineChunks for heads of `head_dim`.
void CombineQuery(int head_dim, const float* partials, int64_t chunks, float* out) {
  WithHeadDim(head_dim, [&](auto dim) { CombineChunks<dim()>(partials, chunks, out); });
}

// The rest of RunTask over a bfloat16 cache (attention_bf16.h), for heads of
// kDim: `tq` holds the task's queries; `task_lowest` is the first key the
// task's first query sees. Chunk by chunk of the task's: keys are scored
// from the tile that holds the first one the task reads on, for every query
// of the task (scores past a query's own keys are never read), and values
// read in pairs from there, so a query's value pairs are the same in every
// task; each query's partial result goes to `partials` ([query][chunk of
// the group]), and a task with all its group's chunks combines them into
// the queries' outputs.
template <int kDim>
void RunBf16Task(const Task& task, const KvLayerView& kv, const AttentionShape& shape,
                 const AttentionSpan& span, TaskQueries& tq, int64_t max_keys, int64_t task_lowest,
                 float* partials) {
  namespace b16 = bf16_attention;
  constexpr int kTile = b16::kTileKeys;
  constexpr int kTilesAtOnce = kKeyBlock / kTile;
  const int queries = static_cast<int>(tq.q.size());
  const size_t stride = PartialFloats(kDim);
  // Per query: its bfloat16 form, its scores over a chunk, its bfloat16
  // probabilities (and a pair's second key past the chunk), the odd pairs'
  // value sums.
  constexpr size_t kChunk = static_cast<size_t>(kKeyChunk);
  thread_local std::vector<uint16_t> words;
  words.resize(static_cast<size_t>(queries) * (kDim + kChunk + 2));
  thread_local std::vector<float> floats;
  floats.resize(static_cast<size_t>(queries) * (kChunk + kDim));
  auto query_words = [&](int i) { return words.data() + static_cast<size_t>(i) * kDim; };
  auto keys = [&](int i) { return tq.keys[static_cast<size_t>(i)]; };
  auto lowest = [&](int i) {
    return shape.window > 0 ? std::max<int64_t>(0, keys(i) - shape.window) : int64_t{0};
  };
  for (int i = 0; i < queries; ++i)
    b16::QueryToBf16<kDim>(tq.q[static_cast<size_t>(i)], query_words(i));

  for (int64_t chunk = task.chunk_begin; chunk < task.chunk_end; ++chunk) {
    const int64_t chunk_first = chunk * kKeyChunk;
    const int64_t end = std::min(max_keys, chunk_first + kKeyChunk);
    const int64_t start = std::max(chunk_first, task_lowest / kTile * kTile);
    // Query i's score and probability of key k (k - chunk_first in
    // [0, kChunk], a pair's second key past the chunk included), and its odd
    // pairs' value sums.
    auto score_at = [&](int i, int64_t k) {
      return floats.data() + static_cast<size_t>(i) * (kChunk + kDim) +
             static_cast<size_t>(k - chunk_first);
    };
    auto odd_sums = [&](int i) {
      return floats.data() + static_cast<size_t>(i) * (kChunk + kDim) + kChunk;
    };
    auto probability_at = [&](int i, int64_t k) {
      return words.data() + static_cast<size_t>(queries) * kDim +
             static_cast<size_t>(i) * (kChunk + 2) + static_cast<size_t>(k - chunk_first);
    };
    auto partial = [&](int i) {
      return partials + (static_cast<size_t>(i) * static_cast<size_t>(task.group_chunks) +
                         static_cast<size_t>(chunk - task.group_chunk)) *
                            stride;
    };
    // Scores, two queries at a time over up to four tiles at a time.
    const uint16_t* tiles[kTilesAtOnce];
    for (int64_t first = start; first < end; first += kKeyBlock) {
      const int n =
          static_cast<int>(std::min<int64_t>(kTilesAtOnce, (end - first + kTile - 1) / kTile));
      KeyTiles(kv, span.block_table, task.kv_head, first, n, tiles);
      for (int begin = 0; begin < queries; begin += 2) {
        const int count = std::min(2, queries - begin);
        const uint16_t* q[2];
        float* out[2];
        for (int b = 0; b < count; ++b) {
          q[b] = query_words(begin + b);
          out[b] = score_at(begin + b, first);
        }
        WithTileCount(n, [&](auto nt) {
          if (count == 2) {
            b16::ScoreTiles<2, nt(), kDim>(q, tiles, shape.scale, out);
          } else {
            b16::ScoreTiles<1, nt(), kDim>(q, tiles, shape.scale, out);
          }
        });
      }
    }
    // The softmax's numerators in bfloat16 over the keys of the chunk each
    // query sees (others get 0), their maximum and float32 sum.
    for (int i = 0; i < queries; ++i) {
      float* part = partial(i);
      const int64_t low = std::max(start, lowest(i));
      const int64_t high = std::min(end, keys(i));
      std::fill(probability_at(i, start), probability_at(i, end + 1), uint16_t{0});
      std::memset(part, 0, sizeof(float) * stride);
      std::memset(odd_sums(i), 0, sizeof(float) * kDim);
      if (high <= low) continue;  // sum 0: no key of this chunk
      if (shape.softcap > 0.0f) SoftcapRow(score_at(i, low), high - low, shape.softcap);
      part[1] = b16::ExpToBf16(score_at(i, low), high - low, probability_at(i, low), &part[0]);
    }
    // Value sums over pairs of keys: consecutive queries in groups (of 4, or
    // all of a smaller task's) over the pairs they all see, then each alone
    // over the rest of its own; the sums of even pairs in the partials, of
    // odd ones in odd_sums.
    const uint16_t* pairs[kKeyBlock / 2];
    auto accumulate = [&](auto group, int64_t first, int n) {
      constexpr int kGroup = decltype(group)::value;
      auto count_pairs = [&](int i) {
        return static_cast<int>((std::clamp<int64_t>(keys(i) - first, 0, n) + 1) / 2);
      };
      ForQueryGroupsOf<kGroup>(
          queries, count_pairs, [&](int begin, int count, int offset, int many) {
            float* even[kGroup];
            float* odd[kGroup];
            const uint16_t* p[kGroup];
            for (int b = 0; b < count; ++b) {
              even[b] = partial(begin + b) + 2;
              odd[b] = odd_sums(begin + b);
              p[b] = probability_at(begin + b, first + 2 * offset);
            }
            const int parity = static_cast<int>((first / 2 + offset) % 2);
            if (count == kGroup) {
              b16::AccumulatePairs<kGroup, kDim>(even, odd, p, pairs + offset, many, parity);
            } else {
              b16::AccumulatePairs<1, kDim>(even, odd, p, pairs + offset, many, parity);
            }
          });
    };
    for (int64_t first = start; first < end; first += kKeyBlock) {
      const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, end - first));
      ValuePairs(kv, span.block_table, task.kv_head, first, (n + 1) / 2, pairs);
      switch (std::min(queries, 4)) {
        case 1:
          accumulate(std::integral_constant<int, 1>{}, first, n);
          break;
        case 2:
          accumulate(std::integral_constant<int, 2>{}, first, n);
          break;
        case 3:
          accumulate(std::integral_constant<int, 3>{}, first, n);
          break;
        default:
          accumulate(std::integral_constant<int, 4>{}, first, n);
      }
    }
    for (int i = 0; i < queries; ++i) {
      float* sums = partial(i) + 2;
      const float* odd = odd_sums(i);
      for (int d = 0; d < kDim; ++d) sums[d] += odd[d];
    }
  }
  if (task.partials < 0) {  // all its group's chunks
    for (int i = 0; i < queries; ++i) {
      CombineChunks<kDim>(
          partials + static_cast<size_t>(i) * static_cast<size_t>(task.group_chunks) * stride,
          task.group_chunks, tq.out[static_cast<size_t>(i)]);
    }
  }
}
#endif

void RunTask(const Task& task, const KvLayerView& kv, const Matrix& q, const AttentionShape& shape,
             const AttentionSpan& span, std::vector<float>& scratch, float* partials, Matrix out) {
  const int head_dim = shape.head_dim;
  const int heads = task.head_end - task.head_begin;
  const int rows = task.row_end - task.row_begin;
  const int queries = heads * rows;
  const int64_t max_keys = int64_t{span.first_position} + task.row_end;
  // (The bfloat16 kernels keep their own scores, a chunk at a time.)
  const size_t score_stride = kv.bf16 ? 0 : static_cast<size_t>(max_keys);
  scratch.resize(score_stride * static_cast<size_t>(queries) +
                 static_cast<size_t>(kKeyBlock) * static_cast<size_t>(head_dim));
  float* block = scratch.data() + score_stride * static_cast<size_t>(queries);
  // Reused by each thread's tasks (about 9 a layer at batch 1), so a step
  // allocates nothing here once the vectors have grown.
  thread_local TaskQueries tq;
  tq.clear();
  for (int i = 0; i < queries; ++i) {
    const int64_t row = int64_t{span.first_row} + task.row_begin + i / heads;
    const int64_t column = int64_t{task.head_begin + i % heads} * head_dim;
    tq.q.push_back(q.Row(row) + column);
    tq.scores.push_back(scratch.data() + score_stride * static_cast<size_t>(i));
    tq.out.push_back(out.Row(row) + column);
    tq.keys.push_back(int64_t{span.first_position} + task.row_begin + i / heads + 1);
  }
  auto visible = [&](int i, int64_t first, int n) {
    return std::min<int64_t>(n, tq.keys[static_cast<size_t>(i)] - first);
  };
  // A sliding window: query i sees keys [lowest(i), keys[i]). The task reads
  // from its first query's lowest key on; a later query's keys below its own
  // lowest are scored with the rest, then given probability 0 (adding 0 x
  // value changes nothing), so its result does not depend on the task.
  auto lowest = [&](int i) {
    return shape.window > 0 ? std::max<int64_t>(0, tq.keys[static_cast<size_t>(i)] - shape.window)
                            : int64_t{0};
  };
  const int64_t task_lowest = lowest(0);
#ifdef TANDEM_CPU_BF16_ATTENTION
  if (kv.bf16) {
    // A task with all its group's chunks keeps its partials here.
    thread_local std::vector<float> own;
    float* at = partials + std::max<int64_t>(0, task.partials);
    if (task.partials < 0) {
      own.resize(TaskPartialFloats(task, head_dim));
      at = own.data();
    }
    WithHeadDim(head_dim, [&](auto dim) {
      RunBf16Task<dim()>(task, kv, shape, span, tq, max_keys, task_lowest, at);
    });
    return;
  }
#endif
#ifdef TANDEM_CPU_AVX512
  const bool vector = HasVectorKernels(head_dim);
#endif

  // A few queries (a decode step) read the halves in place; converting them
  // to floats first pays only when many queries (a prompt chunk) share them.
  // The arithmetic is the same either way.
  const bool in_place =
      kInPlaceSupported && HasVectorKernels(head_dim) && queries <= kInPlaceMaxQueries;
  // Keys or values [first, first + n) of the task's KV head: pointers to the
  // halves in place, or to the floats they were converted to in `block`.
  const uint16_t* half_rows[kKeyBlock];
  const float* float_rows[kKeyBlock];
  auto load_rows = [&](const uint16_t* cache, int64_t first, int n) {
    if (in_place) {
      HalfRows(cache, kv, span.block_table, task.kv_head, first, n, half_rows);
      return;
    }
    ConvertBlock(cache, kv, span.block_table, task.kv_head, first, n, block);
    for (int j = 0; j < n; ++j) float_rows[j] = block + int64_t{j} * head_dim;
  };
  for (int64_t first = task_lowest; first < max_keys; first += kKeyBlock) {
    const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, max_keys - first));
    load_rows(kv.k, first, n);
#ifdef TANDEM_CPU_AVX512
    if (vector) {
      WithHeadDim(head_dim, [&](auto dim) {
        if (in_place) {
          ScoreQueries<dim()>(tq, half_rows, first, n, shape.scale);
        } else {
          ScoreQueries<dim()>(tq, float_rows, first, n, shape.scale);
        }
      });
      continue;
    }
#endif
    for (int i = 0; i < queries; ++i) {
      const int64_t seen = visible(i, first, n);
      if (seen <= 0) continue;
      float* si = tq.scores[static_cast<size_t>(i)] + first;
#ifdef TANDEM_CPU_AVX2
      if (in_place) {
        WithHeadDim(head_dim, [&](auto dim) {
          ScoreRows<dim()>(tq.q[static_cast<size_t>(i)], half_rows, static_cast<int>(seen),
                           shape.scale, si);
        });
        continue;
      }
#endif
      ScoreBlock(tq.q[static_cast<size_t>(i)], block, static_cast<int>(seen), head_dim, shape.scale,
                 si);
    }
  }
  for (int i = 0; i < queries; ++i) {
    float* scores = tq.scores[static_cast<size_t>(i)];
    const int64_t low = lowest(i);
    const int64_t seen = tq.keys[static_cast<size_t>(i)] - low;
    if (shape.softcap > 0.0f) SoftcapRow(scores + low, seen, shape.softcap);
    tq.sums.push_back(ExpAndSum(scores + low, seen));
    std::fill(scores + task_lowest, scores + low, 0.0f);
    std::memset(tq.out[static_cast<size_t>(i)], 0, sizeof(float) * static_cast<size_t>(head_dim));
  }
  for (int64_t first = task_lowest; first < max_keys; first += kKeyBlock) {
    const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, max_keys - first));
    load_rows(kv.v, first, n);
#ifdef TANDEM_CPU_AVX512
    if (vector) {
      WithHeadDim(head_dim, [&](auto dim) {
        if (in_place) {
          AccumulateQueries<dim()>(tq, half_rows, first, n);
        } else {
          AccumulateQueries<dim()>(tq, float_rows, first, n);
        }
      });
      continue;
    }
#endif
    for (int i = 0; i < queries; ++i) {
      const int64_t seen = visible(i, first, n);
      if (seen <= 0) continue;
      float* acc = tq.out[static_cast<size_t>(i)];
      const float* pi = tq.scores[static_cast<size_t>(i)] + first;
#ifdef TANDEM_CPU_AVX2
      if (in_place) {
        WithHeadDim(head_dim, [&](auto dim) {
          AccumulateRows<dim()>(acc, pi, half_rows, static_cast<int>(seen));
        });
        continue;
      }
#endif
      AccumulateBlock(acc, pi, block, static_cast<int>(seen), head_dim);
    }
  }
  for (int i = 0; i < queries; ++i) {
    float* acc = tq.out[static_cast<size_t>(i)];
    const float inverse = 1.0f / tq.sums[static_cast<size_t>(i)];
    for (int d = 0; d < head_dim; ++d) acc[d] *= inverse;
  }
}

}  // namespace

void PagedAttention(ComputeLane& pool, std::vector<std::vector<float>>& scratch,
                    const KvLayerView& kv, const Matrix& q, const AttentionShape& shape,
                    std::span<const AttentionSpan> spans, Matrix out) {
  const int group = shape.heads / shape.kv_heads;
  scratch.resize(static_cast<size_t>(pool.size()));
  // Whole head groups share the most. When there would be too few tasks to
  // keep every thread busy, a sequence's rows are split into tiles of 8, then
  // 4 (a verification: each KV head's keys are still read once for a whole
  // group of heads); over a bfloat16 cache, then its keys into runs of
  // whole chunks (a decode step: each key is still read once); and only
  // then the groups into single heads. Each query's arithmetic is the same
  // either way.
  const bool chunked = kv.bf16;
  std::vector<Task> tasks;
  size_t partial_floats = 0;  // the call's buffer, for the parts of split groups
  auto plan = [&](int heads_per_task, int row_tile, int64_t parts) {
    tasks.clear();
    partial_floats = 0;
    for (size_t s = 0; s < spans.size(); ++s) {
      const AttentionSpan& span = spans[s];
      for (int32_t r = 0; r < span.rows; r += row_tile) {
        const int32_t row_end = std::min(span.rows, r + row_tile);
        // The chunks of keys the tile's queries see: from the first one's
        // lowest key to the last one's.
        const int64_t lowest =
            shape.window > 0
                ? std::max<int64_t>(0, int64_t{span.first_position} + r + 1 - shape.window)
                : 0;
        const int64_t group_chunk = lowest / kKeyChunk;
        const int64_t group_chunks =
            (int64_t{span.first_position} + row_end + kKeyChunk - 1) / kKeyChunk - group_chunk;
        const int64_t split = chunked ? std::min(parts, group_chunks) : 1;
        for (int kv_head = 0; kv_head < shape.kv_heads; ++kv_head) {
          for (int h = 0; h < group; h += heads_per_task) {
            Task task{static_cast<int32_t>(s),
                      kv_head,
                      kv_head * group + h,
                      kv_head * group + std::min(group, h + heads_per_task),
                      r,
                      row_end};
            task.group_chunk = group_chunk;
            task.group_chunks = group_chunks;
            if (split > 1) {
              task.partials = static_cast<int64_t>(partial_floats);
              partial_floats += TaskPartialFloats(task, shape.head_dim);
            }
            for (int64_t part = 0; part < split; ++part) {
              task.chunk_begin = group_chunk + group_chunks * part / split;
              task.chunk_end = group_chunk + group_chunks * (part + 1) / split;
              tasks.push_back(task);
            }
          }
        }
      }
    }
  };
  const size_t threads = static_cast<size_t>(pool.size());
  int row_tile = kRowTile;
  plan(group, row_tile, 1);
  while (row_tile > 4 && tasks.size() < 2 * threads) plan(group, row_tile /= 2, 1);
  int64_t parts = 1;
  if (chunked && tasks.size() < 2 * threads) {
    parts = static_cast<int64_t>((2 * threads + tasks.size() - 1) / tasks.size());
    plan(group, row_tile, parts);
  }
  // Single heads keep the chunk split (short contexts have fewer chunks
  // than the parts asked for).
  if (group > 1 && tasks.size() < 2 * threads) plan(1, kRowTile, parts);
  // (The calling thread's: a thread_local named inside the tasks would be
  // each helper's own.)
  thread_local std::vector<float> partials;
  partials.resize(partial_floats);
  float* const partial_data = partials.data();
  pool.ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t t, int thread) {
    const Task& task = tasks[static_cast<size_t>(t)];
    RunTask(task, kv, q, shape, spans[static_cast<size_t>(task.span)],
            scratch[static_cast<size_t>(thread)], partial_data, out);
  });
#ifdef TANDEM_CPU_BF16_ATTENTION
  // The split groups' queries, from their parts' partials (each group's
  // first part stands for it).
  for (const Task& task : tasks) {
    if (task.partials < 0 || task.chunk_begin != task.group_chunk) continue;
    const AttentionSpan& span = spans[static_cast<size_t>(task.span)];
    const int heads = task.head_end - task.head_begin;
    const size_t per_query = static_cast<size_t>(task.group_chunks) * PartialFloats(shape.head_dim);
    for (int i = 0; i < heads * (task.row_end - task.row_begin); ++i) {
      const int64_t row = int64_t{span.first_row} + task.row_begin + i / heads;
      float* dst = out.Row(row) + int64_t{task.head_begin + i % heads} * shape.head_dim;
      CombineQuery(shape.head_dim, partial_data + task.partials + per_query * i, task.group_chunks,
                   dst);
    }
  }
#endif
}

}  // namespace tandem::kernels::cpu
