#include "client/shape.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/http.h"

namespace tandem::client {
namespace {

// Below this share of requests meeting a budget, the report says so.
constexpr double kAttainmentTarget = 0.9;

// Splits `name{a="1",le="2"}` into its labels, with `le` taken out.
bool SplitBucket(const std::string& key, const std::string& name, std::string* labels, double* le) {
  const std::string prefix = name + "_bucket{";
  if (key.rfind(prefix, 0) != 0 || key.back() != '}') return false;
  const std::string inside = key.substr(prefix.size(), key.size() - prefix.size() - 1);
  std::vector<std::string> kept;
  bool found = false;
  for (absl::string_view pair : absl::StrSplit(inside, ',')) {
    if (pair.substr(0, 4) == "le=\"") {
      const std::string value(pair.substr(4, pair.size() - 5));
      *le = value == "+Inf" ? std::numeric_limits<double>::infinity() : std::stod(value);
      found = true;
    } else {
      kept.emplace_back(pair);
    }
  }
  std::string joined;
  for (size_t i = 0; i < kept.size(); ++i) joined += (i ? "," : "") + kept[i];
  *labels = joined;
  return found;
}

std::string Seconds(double s) {
  if (s < 1) return absl::StrFormat("%.0f ms", s * 1000);
  return absl::StrFormat("%.2f s", s);
}

}  // namespace

double Histogram::Quantile(double q) const {
  if (count <= 0 || buckets.empty()) return 0;
  const double rank = q * count;
  double lower = 0, below = 0;
  for (const auto& [bound, cumulative] : buckets) {
    if (cumulative >= rank) {
      if (std::isinf(bound)) return lower;
      const double in_bucket = cumulative - below;
      return in_bucket <= 0 ? bound : lower + (bound - lower) * (rank - below) / in_bucket;
    }
    lower = bound;
    below = cumulative;
  }
  return lower;
}

Metrics ParseMetrics(const std::string& text) {
  Metrics m;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    try {
      m.samples[line.substr(0, space)] = std::stod(line.substr(space + 1));
    } catch (const std::exception&) {
      // NaN summaries and the like: not needed here.
    }
  }
  return m;
}

double Metrics::Get(const std::string& sample, double fallback) const {
  auto it = samples.find(sample);
  return it == samples.end() ? fallback : it->second;
}

Histogram Metrics::GetHistogram(const std::string& name, const std::string& labels) const {
  Histogram h;
  for (const auto& [key, value] : samples) {
    std::string key_labels;
    double le = 0;
    if (SplitBucket(key, name, &key_labels, &le) && key_labels == labels) {
      h.buckets.emplace_back(le, value);
    }
  }
  std::sort(h.buckets.begin(), h.buckets.end());
  const std::string suffix = labels.empty() ? "" : "{" + labels + "}";
  h.count = Get(name + "_count" + suffix);
  h.sum = Get(name + "_sum" + suffix);
  return h;
}

absl::StatusOr<std::string> HttpGet(const std::string& url) {
  std::string body;
  long http_code = 0;
  absl::Status s = HttpTransfer(
      url, nullptr, 30, [&](const char* data, size_t n) { body.append(data, n); }, &http_code);
  if (!s.ok()) return s;
  if (http_code != 200)
    return absl::UnavailableError(absl::StrFormat("%s: HTTP %d", url, http_code));
  return body;
}

std::string ShapeReport(const Metrics& m, double now_unix_seconds) {
  std::ostringstream out;
  const Histogram prompt = m.GetHistogram("tandem_request_prompt_tokens");
  const Histogram generated = m.GetHistogram("tandem_request_generated_tokens");
  const double started = m.Get("tandem_start_time_seconds", now_unix_seconds);
  const double uptime = std::max(1.0, now_unix_seconds - started);
  double colocated = 0, disaggregated = 0, duration_sum = 0;
  Histogram ttft, itl_colocated, itl_disaggregated;
  for (const char* reason : {"stop", "length", "cancelled", "error"}) {
    colocated += m.Get(
        absl::StrFormat("tandem_requests_total{finish_reason=\"%s\",path=\"colocated\"}", reason));
    disaggregated += m.Get(absl::StrFormat(
        "tandem_requests_total{finish_reason=\"%s\",path=\"disaggregated\"}", reason));
  }
  for (const char* path : {"colocated", "disaggregated"}) {
    duration_sum +=
        m.Get(absl::StrFormat("tandem_request_duration_seconds_sum{path=\"%s\"}", path));
  }
  // TTFT over both paths: merge the two histograms (same buckets).
  const Histogram t1 = m.GetHistogram("tandem_time_to_first_token_seconds", "path=\"colocated\"");
  const Histogram t2 =
      m.GetHistogram("tandem_time_to_first_token_seconds", "path=\"disaggregated\"");
  ttft = t1;
  for (size_t i = 0; i < ttft.buckets.size() && i < t2.buckets.size(); ++i) {
    ttft.buckets[i].second += t2.buckets[i].second;
  }
  ttft.count = t1.count + t2.count;
  itl_colocated = m.GetHistogram("tandem_inter_token_latency_seconds", "path=\"colocated\"");
  itl_disaggregated =
      m.GetHistogram("tandem_inter_token_latency_seconds", "path=\"disaggregated\"");
  const double requests = colocated + disaggregated;
  const double threshold = m.Get("tandem_disagg_output_threshold", -1);

  out << absl::StrFormat("Traffic served: %.0f requests in %.0f s of uptime\n", requests, uptime);
  if (requests == 0) {
    out << "No finished requests yet: nothing to say about the shape.\n";
    return out.str();
  }
  out << absl::StrFormat("  prompt tokens per request:     median %.0f, p90 %.0f\n",
                         prompt.Quantile(0.5), prompt.Quantile(0.9));
  out << absl::StrFormat("  generated tokens per request:  median %.0f, p90 %.0f\n",
                         generated.Quantile(0.5), generated.Quantile(0.9));
  out << absl::StrFormat("  concurrency (mean in flight):  %.2f\n", duration_sum / uptime);
  out << "  time to first token:           p50 " << Seconds(ttft.Quantile(0.5)) << ", p90 "
      << Seconds(ttft.Quantile(0.9)) << ", p99 " << Seconds(ttft.Quantile(0.99)) << "\n";
  for (const auto& [name, h] :
       {std::pair{"colocated", &itl_colocated}, std::pair{"disaggregated", &itl_disaggregated}}) {
    if (h->count == 0) continue;
    out << "  inter-token latency (" << name << "): p50 " << Seconds(h->Quantile(0.5)) << ", p99 "
        << Seconds(h->Quantile(0.99)) << "\n";
  }
  out << absl::StrFormat("  paths: colocated %.0f (%.0f%%), disaggregated %.0f (%.0f%%)\n",
                         colocated, 100 * colocated / requests, disaggregated,
                         100 * disaggregated / requests);
  // Attainment of the requests' latency budgets (those that ended by
  // themselves): the share that met each.
  std::optional<double> attained[2];
  const char* slos[2] = {"ttft", "tpot"};
  for (int i = 0; i < 2; ++i) {
    const double met =
        m.Get(absl::StrFormat("tandem_slo_attainment_total{met=\"true\",slo=\"%s\"}", slos[i]));
    const double missed =
        m.Get(absl::StrFormat("tandem_slo_attainment_total{met=\"false\",slo=\"%s\"}", slos[i]));
    if (met + missed > 0) attained[i] = met / (met + missed);
  }
  if (attained[0] || attained[1]) {
    out << "  SLO attainment:";
    for (int i = 0; i < 2; ++i) {
      if (attained[i])
        out << absl::StrFormat(" %s %.0f%%", i == 0 ? "TTFT" : "TPOT", 100 * *attained[i]);
    }
    out << "\n";
  }

  if (m.Get("tandem_policy_info{policy=\"slo\"}", 0) == 1) {
    out << "Policy: slo (paths, decode pacing and prompt steps from the latency budgets). ";
    const bool ttft_short = attained[0] && *attained[0] < kAttainmentTarget;
    const bool tpot_short = attained[1] && *attained[1] < kAttainmentTarget;
    if (ttft_short) {
      out << "TTFT budgets are missed: prompts wait for compute at this load. Add daemons, or "
             "set --admission=slo so a load balancer retries refused requests elsewhere. ";
    }
    if (tpot_short) {
      out << "TPOT budgets are missed: the streams' tokens cannot all come in time beside the "
             "prompts; fewer streams per daemon (--max_running) or a looser --slo_tpot. ";
    }
    if (!ttft_short && !tpot_short) out << "The budgets are kept.";
    out << "\n";
    return out.str();
  }

  out << "Disaggregation: ";
  if (threshold < 0) {
    out << "off. ";
    out << (generated.Quantile(0.9) > 32
                ? "A tenth or more of the requests generate over 32 tokens; if their inter-token "
                  "latency tail matters, try --disagg_output_threshold=32 with a decode worker.\n"
                : "Outputs are short; colocated serving is the right choice at this shape.\n");
    return out.str();
  }
  out << absl::StrFormat("on at %.0f output tokens. ", threshold);
  if (disaggregated == 0) {
    out << "No request reached it, so it buys nothing while the decode worker's cores idle: "
           "raise no further, but consider --disagg_output_threshold=off for this traffic.\n";
  } else if (itl_colocated.count == 0) {
    out << "Every request was disaggregated: no colocated baseline to compare with; the "
           "threshold may be too low for short requests to stay colocated.\n";
  } else {
    const double d = itl_disaggregated.Quantile(0.99), c = itl_colocated.Quantile(0.99);
    if (d < 0.8 * c) {
      out << "paying for itself: disaggregated streams see p99 inter-token latency " << Seconds(d)
          << " against " << Seconds(c) << " colocated.\n";
    } else {
      out << "not paying for itself: disaggregated streams' p99 inter-token latency (" << Seconds(d)
          << ") is no better than colocated (" << Seconds(c)
          << "); consider a higher threshold or --disagg_output_threshold=off.\n";
    }
  }
  return out.str();
}

}  // namespace tandem::client
