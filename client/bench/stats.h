// What `tandem bench` computes from the requests it observed: percentiles,
// SLO attainment and goodput, per class and for the foreground together.
#ifndef TANDEM_CLIENT_BENCH_STATS_H_
#define TANDEM_CLIENT_BENCH_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/bench/v1/bench.pb.h"

namespace tandem::bench {

// One finished request as the client saw it. Times are seconds on one
// steady clock; `start` is when the request was due (its scheduled arrival
// in an open loop, so a late send counts against the server's latency, not
// hidden: no coordinated omission), token_times one entry per token (tokens
// that arrived in one message share a time).
struct RequestRecord {
  int class_index = 0;
  double start = 0;
  double end = 0;
  std::vector<double> token_times;
  bool ok = false;
  std::string error;
  int prompt_tokens = 0;
  int cached_prompt_tokens = 0;
  // tandemd's v1::Path: 1 colocated, 2 disaggregated; 0 unknown.
  int path = 0;
  // Speculative decoding as the server reported it (0: none or unknown).
  int drafted_tokens = 0;
  int accepted_tokens = 0;
  // The answer ended on its own (a stop condition), not at max_tokens.
  bool stopped = false;
  // A file edit: the session's repository file's non-blank lines, and how
  // many the answer reproduced (CountLinesKept).
  int edit_file_lines = 0;
  int edit_lines_kept = 0;

  double TtftMs() const;
  // Mean time per output token after the first (0 with fewer than 2 tokens).
  double MeanItlMs() const;
};

// Inter-token latencies of one request: a message that brought k tokens
// (speculative decoding accepts several at once) after a gap g gives k
// samples of g/k, so the distribution agrees with the mean (and a burst is
// not reported as zero-latency tokens). The first message gives none.
std::vector<double> TokenGapsMs(const RequestRecord& r);

// The q-quantile (q in [0, 1]) by linear interpolation between the closest
// ranks (numpy's default); 0 for no samples. `samples` need not be sorted.
double Percentile(std::vector<double> samples, double q);

v1::Latency Summarize(const std::vector<double>& samples_ms);

// Whether a request met its SLOs: succeeded, TTFT <= slo_ttft_ms, and mean
// inter-token latency <= slo_itl_ms (a one-token answer has none to miss).
bool MeetsSlo(const RequestRecord& r, double slo_ttft_ms, double slo_itl_ms);

// A class's report over `wall_s` seconds of measurement. Rates divide by
// wall_s; `max_errors` first error messages are kept.
v1::ClassReport ReportClass(const std::string& name, bool background, double slo_ttft_ms,
                            double slo_itl_ms, const std::vector<const RequestRecord*>& records,
                            double wall_s, int max_errors = 5);

}  // namespace tandem::bench

#endif  // TANDEM_CLIENT_BENCH_STATS_H_
