// Runs one scenario against one target: closed-loop clients or Poisson
// arrivals per request class, sessions whose context grows turn by turn,
// bounded by a request count and a duration. Returns what every request saw.
#ifndef TANDEM_CLIENT_BENCH_RUNNER_H_
#define TANDEM_CLIENT_BENCH_RUNNER_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/bench/stats.h"
#include "client/bench/targets.h"
#include "client/bench/workload.h"
#include "tandem/bench/v1/bench.pb.h"

namespace tandem::bench {

struct RunOptions {
  // Requests per foreground class (0: until `duration_s`).
  int requests = 0;
  // The run stops starting requests after this many seconds (0: no bound
  // but `requests`; one of the two must be set).
  double duration_s = 0;
  // Overrides for the foreground classes' load (0: the scenario's).
  int concurrency = 0;
  double rate = 0;
  // Fixed output length for the foreground classes (0: their distribution).
  int output_tokens = 0;
  // The operator's latency budget for the foreground classes (0: the
  // scenario's SLOs).
  double slo_ttft_ms = 0;
  double slo_itl_ms = 0;
  uint64_t seed = 1;
  double request_timeout_s = 600;
  // Open loop: at most this many requests in flight; later arrivals wait
  // (and their wait counts in their latency).
  int max_inflight = 512;
  bool progress = false;  // a progress line on stderr
  // Replayed instead of the scenario's arrivals (one open-loop class).
  std::vector<v1::TraceRecord> trace;
};

// A source file a file-edit session asks to change, with its length in the
// served model's tokens.
struct SourceFile {
  std::string path;
  std::string text;
  int tokens = 0;
};

// What prompts are made of.
struct PromptSources {
  // The tokenized "prose" and "code" corpora, for token-window classes
  // ("prose" is always needed).
  std::map<std::string, Corpus> corpora;
  // For file-edit classes: the repository's source files, and the target
  // whose chat template renders the conversations (tandemd serving the same
  // model; the measured target itself when null).
  std::vector<SourceFile> files;
  Target* chat = nullptr;
};

struct RunResult {
  std::vector<RequestRecord> records;
  // Run start to the end of the last foreground request.
  double wall_s = 0;
};

// `scenario` is the one EffectiveScenario returned for `options` (the
// overrides are applied there, once).
RunResult RunScenario(const v1::Scenario& scenario, Target& target, const PromptSources& sources,
                      const RunOptions& options);

// The files a file-edit class edits: those of `files` whose length is within
// the class's input_tokens [min, max] (0: no bound).
std::vector<const SourceFile*> EditableFiles(const v1::RequestClass& request_class,
                                             const std::vector<SourceFile>& files);

// The scenario as run: overrides applied, or the trace's single class.
v1::Scenario EffectiveScenario(const v1::Scenario& scenario, const RunOptions& options);

// The report of one run: a ClassReport per class, the foreground total,
// the prefix-cache hit ratio (cached over prompt tokens of the foreground).
v1::RunReport BuildRunReport(const v1::Scenario& effective, const std::string& target,
                             const RunResult& result);

}  // namespace tandem::bench

#endif  // TANDEM_CLIENT_BENCH_RUNNER_H_
