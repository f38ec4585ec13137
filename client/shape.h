// `tandem shape`: the token shape of the traffic a daemon served, read from
// its Prometheus metrics, and whether output-length-gated disaggregation is
// paying for itself at that shape.
#ifndef TANDEM_CLIENT_SHAPE_H_
#define TANDEM_CLIENT_SHAPE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::client {

// One histogram's cumulative buckets (upper bound -> count), count and sum.
struct Histogram {
  std::vector<std::pair<double, double>> buckets;  // sorted by bound; +Inf last
  double count = 0;
  double sum = 0;
  // The q-quantile by linear interpolation inside the bucket that holds it
  // (as Prometheus' histogram_quantile does); 0 when empty.
  double Quantile(double q) const;
};

// Samples of a Prometheus text exposition, by full name with labels.
struct Metrics {
  std::map<std::string, double> samples;  // e.g. `a_total{x="y"}` -> value
  // A histogram (name without _bucket), for the given label set ("" or
  // `path="colocated"`).
  Histogram GetHistogram(const std::string& name, const std::string& labels = "") const;
  double Get(const std::string& sample, double fallback = 0) const;
};

Metrics ParseMetrics(const std::string& text);

// Fetches `url` (http://host:port/path) with libcurl; a non-200 answer is an
// error.
absl::StatusOr<std::string> HttpGet(const std::string& url);

// The report `tandem shape` prints. `now_unix_seconds` dates the scrape.
std::string ShapeReport(const Metrics& metrics, double now_unix_seconds);

}  // namespace tandem::client

#endif  // TANDEM_CLIENT_SHAPE_H_
