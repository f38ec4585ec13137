// Host sampling cost per logits row (kernels::SampleRow, the CPU backend's
// SampleRows), for the vocabularies of SmolLM2 (49,152) and Llama 3
// (128,256), by kind of draw. Run: build/bin/tandem-sampling-bench
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/kernels/sample_row.h"

namespace tandem::kernels {
namespace {

// Logits shaped like a language model's: a few likely tokens over a normal
// spread.
std::vector<float> Logits(int64_t vocab) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> row(static_cast<size_t>(vocab));
  for (float& l : row) l = normal(rng);
  for (int i = 0; i < 8; ++i) row[static_cast<size_t>(i * 97)] = 18.0f - static_cast<float>(i);
  return row;
}

// state.range(1): 0 greedy, 1 plain temperature, 2 top-k 40 + top-p 0.95
// (the daemon's defaults), 3 top-p 0.9 alone.
void BM_SampleRow(benchmark::State& state) {
  const std::vector<float> row = Logits(state.range(0));
  RowDraw draw;
  const int64_t kind = state.range(1);
  if (kind >= 1) draw.temperature = 0.8f;
  if (kind == 2) {
    draw.top_k = 40;
    draw.top_p = 0.95f;
  }
  if (kind == 3) draw.top_p = 0.9f;
  static constexpr const char* kNames[] = {"greedy", "temperature", "top_k40_top_p0.95",
                                           "top_p0.9"};
  state.SetLabel(kNames[kind]);
  int64_t draws = 0;
  for (auto _ : state) {
    draw.u = static_cast<double>(draws++ % 1000) / 1000.0;
    benchmark::DoNotOptimize(SampleRow(row, draw));
  }
}
BENCHMARK(BM_SampleRow)
    ->ArgsProduct({{49152, 128256}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tandem::kernels

BENCHMARK_MAIN();
