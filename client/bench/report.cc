#include "client/bench/report.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/bench/stats.h"
#include "google/protobuf/util/json_util.h"

namespace tandem::bench {

client::Metrics ScrapeSum(const std::vector<std::string>& urls, std::vector<std::string>* errors) {
  client::Metrics sum;
  for (const std::string& url : urls) {
    absl::StatusOr<std::string> text = client::HttpGet(url);
    if (!text.ok()) {
      errors->push_back(absl::StrCat("metrics ", url, ": ", text.status().message()));
      continue;
    }
    for (const auto& [key, value] : client::ParseMetrics(*text).samples) sum.samples[key] += value;
  }
  return sum;
}

client::Metrics Difference(const client::Metrics& after, const client::Metrics& before) {
  client::Metrics delta;
  for (const auto& [key, value] : after.samples) delta.samples[key] = value - before.Get(key);
  return delta;
}

std::vector<v1::ServerHistogram> PhaseHistograms(const client::Metrics& delta) {
  std::vector<v1::ServerHistogram> out;
  auto add = [&](const std::string& name, const std::string& labels) {
    const client::Histogram h = delta.GetHistogram(name, labels);
    if (h.count <= 0) return;
    v1::ServerHistogram s;
    s.set_name(name);
    s.set_labels(labels);
    s.set_count(h.count);
    s.set_p50(h.Quantile(0.5));
    s.set_p99(h.Quantile(0.99));
    s.set_mean(h.sum / h.count);
    out.push_back(s);
  };
  for (const char* path : {"path=\"colocated\"", "path=\"disaggregated\""}) {
    for (const char* name : {"tandem_time_to_first_token_seconds", "tandem_queue_time_seconds",
                             "tandem_prefill_time_seconds", "tandem_handoff_time_seconds",
                             "tandem_decode_time_seconds", "tandem_inter_token_latency_seconds"}) {
      add(name, path);
    }
  }
  for (const char* worker : {"worker=\"prefill\"", "worker=\"decode\""}) {
    add("tandem_step_time_seconds", worker);
    add("tandem_step_tokens", worker);
  }
  add("tandem_decode_start_delay_seconds", "");
  return out;
}

namespace {

struct Measure {
  const char* name;
  bool higher_is_better;
  double (*get)(const v1::RunReport&);
};

const Measure kMeasures[] = {
    {"goodput (req/s)", true, [](const v1::RunReport& r) { return r.total().goodput_per_s(); }},
    {"output tokens/s", true,
     [](const v1::RunReport& r) { return r.total().output_tokens_per_s(); }},
    {"requests/s", true, [](const v1::RunReport& r) { return r.total().requests_per_s(); }},
    {"TTFT p50", false, [](const v1::RunReport& r) { return r.total().ttft_ms().p50(); }},
    {"TTFT p99", false, [](const v1::RunReport& r) { return r.total().ttft_ms().p99(); }},
    {"ITL p50", false, [](const v1::RunReport& r) { return r.total().itl_ms().p50(); }},
    // Time per output token after the first, all tokens counted: the ratio
    // is the decode speed-up (speculative decoding's figure).
    {"ITL mean", false, [](const v1::RunReport& r) { return r.total().itl_ms().mean(); }},
    {"ITL p99", false, [](const v1::RunReport& r) { return r.total().itl_ms().p99(); }},
};

}  // namespace

std::vector<v1::Ratio> PairRatios(const std::vector<v1::RunReport>& ours,
                                  const std::vector<v1::RunReport>& theirs) {
  std::vector<v1::Ratio> ratios;
  const size_t pairs = std::min(ours.size(), theirs.size());
  if (pairs == 0) return ratios;
  for (const Measure& m : kMeasures) {
    v1::Ratio r;
    // Always "how many times better ours is": ours/theirs for rates,
    // theirs/ours for latencies.
    r.set_measure(absl::StrCat(m.name, m.higher_is_better ? " ours/theirs" : " theirs/ours"));
    std::vector<double> values;
    for (size_t i = 0; i < pairs; ++i) {
      const double a = m.get(ours[i]), b = m.get(theirs[i]);
      const double num = m.higher_is_better ? a : b, den = m.higher_is_better ? b : a;
      if (den > 0) values.push_back(num / den);
    }
    // No pair with a nonzero denominator (e.g. neither met its SLOs): kept,
    // with no values, so the report says so instead of dropping the row.
    if (values.empty()) {
      ratios.push_back(r);
      continue;
    }
    for (double v : values) r.add_values(v);
    r.set_median(Percentile(values, 0.5));
    r.set_min(*std::min_element(values.begin(), values.end()));
    r.set_max(*std::max_element(values.begin(), values.end()));
    ratios.push_back(r);
  }
  return ratios;
}

std::string ToJson(const v1::BenchReport& report) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(report, &json, options);
  return json;
}

std::string ToMarkdown(const v1::BenchReport& report) {
  std::string md = absl::StrCat("# tandem bench\n\n`", report.command(), "`\n\n");
  absl::StrAppend(&md,
                  "| scenario | target | config | load | class | requests | failed | goodput req/s "
                  "(SLO met) | req/s | out tok/s | TTFT p50/p90/p99 ms | ITL p50/p90/p99 ms | "
                  "E2E p50/p99 ms | prefix hit | colocated/disagg |\n");
  absl::StrAppend(&md, "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const v1::RunReport& run : report.runs()) {
    const std::string load = run.concurrency() > 0 ? absl::StrCat(run.concurrency(), " clients")
                                                   : absl::StrFormat("%.2f req/s", run.rate());
    std::vector<v1::ClassReport> rows(run.classes().begin(), run.classes().end());
    if (run.classes_size() > 1) rows.push_back(run.total());
    for (const v1::ClassReport& c : rows) {
      const double met =
          c.requests() > 0 ? 100.0 * static_cast<double>(c.good()) / c.requests() : 0;
      absl::StrAppendFormat(
          &md,
          "| %s | %s | %s | %s | %s%s | %d | %d | %.3f (%.0f%%) | %.3f | %.1f | %.0f / %.0f / %.0f "
          "| %.1f / %.1f / %.1f | %.0f / %.0f | %.0f%% | %d / %d |\n",
          run.scenario(), run.target(), run.config().empty() ? "-" : run.config(), load, c.name(),
          c.background() ? " (bg)" : "", c.requests(), c.failures(), c.goodput_per_s(), met,
          c.requests_per_s(), c.output_tokens_per_s(), c.ttft_ms().p50(), c.ttft_ms().p90(),
          c.ttft_ms().p99(), c.itl_ms().p50(), c.itl_ms().p90(), c.itl_ms().p99(), c.e2e_ms().p50(),
          c.e2e_ms().p99(),
          c.prompt_tokens() > 0 ? 100.0 * c.cached_prompt_tokens() / c.prompt_tokens() : 0.0,
          c.colocated(), c.disaggregated());
    }
  }
  // Speculation (and answers that end on their own: file-edit classes) per
  // class, where any run reports them.
  bool any_speculation = false;
  for (const v1::RunReport& run : report.runs()) {
    for (const v1::ClassReport& c : run.classes()) {
      any_speculation |= c.drafted_tokens() > 0 || c.stopped() > 0;
    }
  }
  if (any_speculation) {
    absl::StrAppend(&md,
                    "\n## Speculative decoding\n\n"
                    "| scenario | target | config | class | drafted | accepted | acceptance | "
                    "tokens per step | answers ended by the model | file lines kept |\n"
                    "|---|---|---|---|---:|---:|---:|---:|---:|---:|\n");
    for (const v1::RunReport& run : report.runs()) {
      for (const v1::ClassReport& c : run.classes()) {
        const double acceptance = c.drafted_tokens() > 0
                                      ? 100.0 * static_cast<double>(c.accepted_tokens()) /
                                            static_cast<double>(c.drafted_tokens())
                                      : 0.0;
        const std::string kept =
            c.edit_file_lines() > 0
                ? absl::StrFormat("%.0f%%", 100.0 * static_cast<double>(c.edit_lines_kept()) /
                                                static_cast<double>(c.edit_file_lines()))
                : "-";
        absl::StrAppendFormat(
            &md, "| %s | %s | %s | %s | %d | %d | %.0f%% | %.2f | %d / %d | %s |\n", run.scenario(),
            run.target(), run.config().empty() ? "-" : run.config(), c.name(), c.drafted_tokens(),
            c.accepted_tokens(), acceptance, c.tokens_per_step(), c.stopped(),
            c.requests() - c.failures(), kept);
      }
    }
  }
  bool any_server = false;
  for (const v1::RunReport& run : report.runs()) any_server |= run.server_size() > 0;
  if (any_server) {
    absl::StrAppend(&md,
                    "\n## Server-side phases (tandemd's histograms over each run)\n\n"
                    "| scenario | config | histogram | labels | count | p50 | p99 | mean |\n"
                    "|---|---|---|---|---:|---:|---:|---:|\n");
    for (const v1::RunReport& run : report.runs()) {
      for (const v1::ServerHistogram& h : run.server()) {
        const bool tokens = h.name() == "tandem_step_tokens";
        const double scale = tokens ? 1 : 1000;
        const char* unit = tokens ? "" : " ms";
        absl::StrAppendFormat(&md, "| %s | %s | %s | %s | %.0f | %.1f%s | %.1f%s | %.1f%s |\n",
                              run.scenario(), run.config().empty() ? "-" : run.config(), h.name(),
                              h.labels(), h.count(), scale * h.p50(), unit, scale * h.p99(), unit,
                              scale * h.mean(), unit);
      }
    }
  }
  if (!report.ratios().empty()) {
    absl::StrAppend(
        &md,
        "\n## Ratios, pair by pair (A B, B A, ...; how many times better the first named is)\n\n"
        "| measure | median | min | max | pairs |\n|---|---:|---:|---:|---:|\n");
    for (const v1::Ratio& r : report.ratios()) {
      if (r.values().empty()) {
        absl::StrAppendFormat(&md, "| %s | n/a: the divisor was 0 in every pair | | | 0 |\n",
                              r.measure());
        continue;
      }
      absl::StrAppendFormat(&md, "| %s | %.2fx | %.2fx | %.2fx | %d |\n", r.measure(), r.median(),
                            r.min(), r.max(), r.values_size());
    }
  }
  if (!report.recommendation().empty()) {
    absl::StrAppend(&md, "\n## Threshold\n\n", report.recommendation(), "\n");
  }
  return md;
}

absl::Status WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path);
  out << content;
  out.close();
  if (!out) return absl::UnavailableError("cannot write " + path);
  return absl::OkStatus();
}

}  // namespace tandem::bench
