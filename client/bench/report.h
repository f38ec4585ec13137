// `tandem bench` output: the servers' own histograms over a run (scraped
// before and after), the JSON report, and the Markdown tables people read.
#ifndef TANDEM_CLIENT_BENCH_REPORT_H_
#define TANDEM_CLIENT_BENCH_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/shape.h"
#include "tandem/bench/v1/bench.pb.h"

namespace tandem::bench {

// The sum of the metrics pages at `urls` (pages that cannot be read are
// skipped; `errors` gets one line for each).
client::Metrics ScrapeSum(const std::vector<std::string>& urls, std::vector<std::string>* errors);

// after - before, sample by sample (counters and histogram series).
client::Metrics Difference(const client::Metrics& after, const client::Metrics& before);

// The per-phase histograms of tandemd over a run (from Difference), by path
// or worker, with p50/p99 as Prometheus' histogram_quantile computes them.
std::vector<v1::ServerHistogram> PhaseHistograms(const client::Metrics& delta);

// Ratios of ours (runs of target `ours`) to the peer's, pair by pair: run i
// of one against run i of the other.
std::vector<v1::Ratio> PairRatios(const std::vector<v1::RunReport>& ours,
                                  const std::vector<v1::RunReport>& theirs);

std::string ToJson(const v1::BenchReport& report);
std::string ToMarkdown(const v1::BenchReport& report);

absl::Status WriteFile(const std::string& path, const std::string& content);

}  // namespace tandem::bench

#endif  // TANDEM_CLIENT_BENCH_REPORT_H_
