// Prefix-cache bookkeeping on a 32k-token prompt (Google Benchmark):
//   build/bin/tandem-prefix-bench [--benchmark_filter=...]
//
// Lookup: the longest cached prefix of a 32,768-token prompt, all of it
// cached (2,047 of 2,048 blocks of 16 hit) or none of it. Admit+Commit: a
// new sequence taking 2,048 blocks and registering all of them. These run on
// the scheduler thread once per admission, so they bound how fast a long
// resent conversation can be admitted.
#include <benchmark/benchmark.h>

#include <vector>

#include "kvcache/kv_cache_manager.h"

namespace tandem::kvcache {
namespace {

constexpr int32_t kTokens = 32768;
constexpr int32_t kBlockSize = 16;

std::vector<TokenId> Prompt(int salt) {
  std::vector<TokenId> t(kTokens);
  for (int32_t i = 0; i < kTokens; ++i) t[static_cast<size_t>(i)] = (i * 7919 + salt) % 49152;
  return t;
}

void BM_LookupHit(benchmark::State& state) {
  KvCacheManager kv(kTokens / kBlockSize + 16, kBlockSize);
  const std::vector<TokenId> prompt = Prompt(1);
  kv.Admit(1, "", prompt, {}, kTokens);
  kv.Commit(1, prompt, kTokens);
  for (auto _ : state) {
    PrefixMatch match = kv.FindPrefix(prompt, "");
    benchmark::DoNotOptimize(match);
    if (match.tokens != kTokens - kBlockSize) state.SkipWithError("expected a full hit");
  }
  state.SetItemsProcessed(state.iterations() * kTokens);
}
BENCHMARK(BM_LookupHit)->Unit(benchmark::kMicrosecond);

void BM_LookupMissAtFirstBlock(benchmark::State& state) {
  KvCacheManager kv(kTokens / kBlockSize + 16, kBlockSize);
  const std::vector<TokenId> cached = Prompt(1), other = Prompt(2);
  kv.Admit(1, "", cached, {}, kTokens);
  kv.Commit(1, cached, kTokens);
  for (auto _ : state) benchmark::DoNotOptimize(kv.FindPrefix(other, ""));
  state.SetItemsProcessed(state.iterations() * kTokens);
}
BENCHMARK(BM_LookupMissAtFirstBlock)->Unit(benchmark::kMicrosecond);

void BM_AdmitAndCommit(benchmark::State& state) {
  KvCacheManager kv(kTokens / kBlockSize + 16, kBlockSize);
  const std::vector<TokenId> prompt = Prompt(3);
  SequenceId id = 1;
  for (auto _ : state) {
    kv.Admit(id, "", prompt, {}, kTokens);
    kv.Commit(id, prompt, kTokens);  // hashes and indexes 2,048 blocks
    state.PauseTiming();
    kv.Release(id++);  // blocks stay cached; the next admission evicts them
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kTokens);
}
BENCHMARK(BM_AdmitAndCommit)->Unit(benchmark::kMicrosecond);

void BM_AdmitReusingTheCache(benchmark::State& state) {
  KvCacheManager kv(kTokens / kBlockSize + 16, kBlockSize);
  const std::vector<TokenId> prompt = Prompt(4);
  kv.Admit(1, "", prompt, {}, kTokens);
  kv.Commit(1, prompt, kTokens);
  kv.Release(1);
  SequenceId id = 2;
  for (auto _ : state) {
    const PrefixMatch match = kv.FindPrefix(prompt, "");
    kv.Admit(id, "", prompt, match, kTokens);
    kv.Commit(id, prompt, kTokens);
    state.PauseTiming();
    kv.Release(id++);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kTokens);
}
BENCHMARK(BM_AdmitReusingTheCache)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tandem::kvcache

BENCHMARK_MAIN();
