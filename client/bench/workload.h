// What `tandem bench` sends and when: lengths drawn from a scenario's
// distributions, prompts cut from real text with a controlled shared prefix,
// Poisson arrival times, and trace files. Deterministic for a given seed.
#ifndef TANDEM_CLIENT_BENCH_WORKLOAD_H_
#define TANDEM_CLIENT_BENCH_WORKLOAD_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/bench/v1/bench.pb.h"

namespace tandem::bench {

using TokenIds = std::vector<uint32_t>;

// A draw from `lengths` (log-normal around the median, clamped).
int DrawLength(const v1::Lengths& lengths, std::mt19937_64& rng);

// `count` arrival times (seconds from 0) of a Poisson process at `rate`
// per second: exponential gaps, the first one included.
std::vector<double> PoissonArrivals(double rate, int count, uint64_t seed);

// Real text, tokenized once, that prompts are cut from. A window may wrap
// around the end of the text.
class Corpus {
 public:
  explicit Corpus(TokenIds tokens) : tokens_(std::move(tokens)) {}
  size_t size() const { return tokens_.size(); }
  // `length` tokens starting at `offset` (mod the corpus size).
  TokenIds Window(uint64_t offset, int length) const;

 private:
  TokenIds tokens_;
};

// Builds each request's prompt for one request class: a shared prefix (one
// of the class's prefix groups) and then text of the request's own. Prompts
// of different requests start their own text at different places, so only
// the intended prefix is shared.
class PromptBuilder {
 public:
  PromptBuilder(const Corpus& corpus, const v1::RequestClass& request_class, uint64_t seed);
  // The prompt of the class's `index`-th request (or session), of `length`
  // tokens.
  TokenIds Prompt(int64_t index, int length) const;
  // `length` new tokens for turn `turn` of session `index`.
  TokenIds TurnInput(int64_t index, int turn, int length) const;

 private:
  const Corpus& corpus_;
  double shared_ratio_;
  int groups_;
  uint64_t seed_;
};

// The program's directory (for finding the corpus and tandemd beside it).
std::string ExecutableDir();

// The text of the corpus named "prose" (docs/*.md and README.md) or "code"
// (engine/, scheduler/, server/, kvcache/ C++ sources) under `source_dir`,
// concatenated in a fixed (sorted) order.
absl::StatusOr<std::string> CorpusText(const std::string& source_dir, const std::string& name);

// Reads a trace: one JSON object (v1::TraceRecord) per line; blank lines
// are skipped. Arrival times must not decrease.
absl::StatusOr<std::vector<v1::TraceRecord>> ParseTrace(const std::string& jsonl);

}  // namespace tandem::bench

#endif  // TANDEM_CLIENT_BENCH_WORKLOAD_H_
