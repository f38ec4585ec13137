// tandem-attention-bench: what the CPU paged attention costs a decode step
// and a verification of drafted tokens: one sequence of --context cached
// tokens, R query rows at its end (R = 1: a decode token; R > 1: the token
// and R - 1 drafts), the shape of --heads/--kv_heads/--head_dim, on
// --threads threads. Prints the median time of --repeats calls per R, its
// ratio to R = 1, and the cost of each row beyond the first.
//
//   build/bin/tandem-attention-bench --context=4000 --rows=1,2,4,8,16,32
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/row_cost.h"
#include "engine/kernels/cpu/attention.h"
#include "engine/kernels/cpu/attention_bf16.h"
#include "engine/kernels/cpu/compute_pool.h"
#include "engine/kernels/half.h"

ABSL_FLAG(int, context, 4000, "cached tokens before the query rows");
ABSL_FLAG(std::vector<std::string>, rows,
          std::vector<std::string>({"1", "2", "4", "8", "16", "32"}),
          "query rows per call (a decode token and its drafts)");
ABSL_FLAG(int, heads, 9, "query heads (SmolLM2-135M: 9)");
ABSL_FLAG(int, kv_heads, 3, "KV heads (SmolLM2-135M: 3)");
ABSL_FLAG(int, head_dim, 64, "head dimension");
ABSL_FLAG(int, layers, 30, "layers per step (the time printed is one step's, all layers)");
ABSL_FLAG(int, threads, 2, "compute threads");
ABSL_FLAG(int, repeats, 21, "timed steps per row count (the median is printed)");
ABSL_FLAG(std::vector<std::string>, caches, std::vector<std::string>({"half", "bf16"}),
          "KV caches to time, one table each: half (the f32 and q8 modes' cache and "
          "kernels) or bf16 (the bf16 mode's, where the build has AVX-512 BF16)");
ABSL_FLAG(bool, layer_caches, true,
          "each layer its own keys and values, so a step reads them all from memory as a "
          "daemon's does (false: one layer's, reused, which stay in the CPU's caches)");
ABSL_FLAG(int, passes, 1,
          "times to run the tables in turn (caches alternated, for comparing them)");

namespace tandem::kernels::cpu {
namespace {

constexpr int kBlockSize = 16;

// Allocates on 64-byte boundaries (a vector load never straddles two lines).
template <typename T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  explicit AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{64}); }
  bool operator==(const AlignedAllocator&) const { return true; }
};

int Main() {
  const int context = absl::GetFlag(FLAGS_context);
  const int heads = absl::GetFlag(FLAGS_heads), kv_heads = absl::GetFlag(FLAGS_kv_heads);
  const int head_dim = absl::GetFlag(FLAGS_head_dim), layers = absl::GetFlag(FLAGS_layers);
  int max_rows = 1;
  for (const std::string& r : absl::GetFlag(FLAGS_rows))
    max_rows = std::max(max_rows, std::stoi(r));
  const int positions = context + max_rows;
  const int blocks = (positions + kBlockSize - 1) / kBlockSize;
  // Random keys and values (halves, and the same rounded to bfloat16; the
  // words' order within a block does not matter for timing) for each layer
  // (or one for all), blocks in a shuffled order as a running cache holds
  // them, aligned to cache lines as the backend's mapped cache is.
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t pool_words = static_cast<size_t>(blocks) * kBlockSize * kv_heads * head_dim;
  const int pools = absl::GetFlag(FLAGS_layer_caches) ? layers : 1;
  const size_t words = pool_words * static_cast<size_t>(pools);
  std::vector<uint16_t, AlignedAllocator<uint16_t>> k(words), v(words), k_bf16(words),
      v_bf16(words);
  for (size_t i = 0; i < words; ++i) {
    const float key = normal(rng), value = normal(rng);
    k[i] = FloatToHalf(key);
    v[i] = FloatToHalf(value);
    k_bf16[i] = FloatToBf16(key);
    v_bf16[i] = FloatToBf16(value);
  }
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int b = 0; b < blocks; ++b) table[static_cast<size_t>(b)] = b;
  std::shuffle(table.begin(), table.end(), rng);
  const AttentionShape shape{heads, kv_heads, head_dim, 1.0f / std::sqrt(float(head_dim))};
  std::vector<float> q(static_cast<size_t>(max_rows) * heads * head_dim),
      out(static_cast<size_t>(max_rows) * heads * head_dim);
  for (float& x : q) x = normal(rng);

  ComputePool pool(absl::GetFlag(FLAGS_threads));
  ComputeLane& lane = pool.lane(LanePriority::kLatency);
  std::vector<std::vector<float>> scratch;
  std::printf("context %d, %d heads, %d KV heads, head_dim %d, %d layers (%s), %d threads\n",
              context, heads, kv_heads, head_dim, layers,
              pools > 1 ? "each its own KV" : "one KV for all", pool.size());
  for (int pass = 0; pass < absl::GetFlag(FLAGS_passes); ++pass) {
    for (const std::string& cache : absl::GetFlag(FLAGS_caches)) {
      const bool bf16 = cache == "bf16";
      if (bf16 && !bf16_attention::Supported(head_dim)) {
        std::printf("cache bf16: not in this build or for head_dim %d\n", head_dim);
        continue;
      }
      auto layer_view = [&](int layer) {
        const size_t at = pool_words * static_cast<size_t>(layer % pools);
        return KvLayerView{(bf16 ? k_bf16.data() : k.data()) + at,
                           (bf16 ? v_bf16.data() : v.data()) + at,
                           kBlockSize,
                           kv_heads,
                           head_dim,
                           bf16};
      };
      std::printf("cache %s\n%5s %10s %9s %14s\n", bf16 ? "bf16" : "half", "rows", "step ms",
                  "vs 1 row", "ms/extra row");
      double one_row = 0;
      for (const std::string& text : absl::GetFlag(FLAGS_rows)) {
        const int rows = std::stoi(text);
        const AttentionSpan span{0, rows, context, table};
        const Matrix qm{q.data(), rows, int64_t{heads} * head_dim};
        const Matrix om{out.data(), rows, int64_t{heads} * head_dim};
        const double median = bench::MedianMs(absl::GetFlag(FLAGS_repeats), [&] {
          for (int l = 0; l < layers; ++l) {
            PagedAttention(lane, scratch, layer_view(l), qm, shape,
                           std::span<const AttentionSpan>(&span, 1), om);
          }
        });
        if (rows == 1) one_row = median;
        bench::PrintRowCost(rows, median, one_row);
        std::printf("\n");
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem::kernels::cpu

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::kernels::cpu::Main();
}
