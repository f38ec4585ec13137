#include "client/bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tandem::bench {

double RequestRecord::TtftMs() const {
  return token_times.empty() ? 0 : 1000 * (token_times.front() - start);
}

double RequestRecord::MeanItlMs() const {
  if (token_times.size() < 2) return 0;
  return 1000 * (token_times.back() - token_times.front()) /
         static_cast<double>(token_times.size() - 1);
}

std::vector<double> TokenGapsMs(const RequestRecord& r) {
  std::vector<double> gaps;
  const std::vector<double>& t = r.token_times;
  size_t group = 0;  // first token of the current message
  while (group < t.size()) {
    size_t next = group;
    while (next < t.size() && t[next] == t[group]) ++next;
    if (group > 0) {
      const double share = 1000 * (t[group] - t[group - 1]) / static_cast<double>(next - group);
      gaps.insert(gaps.end(), next - group, share);
    }
    group = next;
  }
  return gaps;
}

double Percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(samples.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, samples.size() - 1);
  return samples[lo] + (samples[hi] - samples[lo]) * (rank - static_cast<double>(lo));
}

v1::Latency Summarize(const std::vector<double>& samples_ms) {
  v1::Latency l;
  l.set_samples(static_cast<int64_t>(samples_ms.size()));
  if (samples_ms.empty()) return l;
  l.set_p50(Percentile(samples_ms, 0.5));
  l.set_p90(Percentile(samples_ms, 0.9));
  l.set_p99(Percentile(samples_ms, 0.99));
  l.set_mean(std::accumulate(samples_ms.begin(), samples_ms.end(), 0.0) /
             static_cast<double>(samples_ms.size()));
  l.set_max(*std::max_element(samples_ms.begin(), samples_ms.end()));
  return l;
}

bool MeetsSlo(const RequestRecord& r, double slo_ttft_ms, double slo_itl_ms) {
  return r.ok && !r.token_times.empty() && r.TtftMs() <= slo_ttft_ms && r.MeanItlMs() <= slo_itl_ms;
}

v1::ClassReport ReportClass(const std::string& name, bool background, double slo_ttft_ms,
                            double slo_itl_ms, const std::vector<const RequestRecord*>& records,
                            double wall_s, int max_errors) {
  v1::ClassReport c;
  c.set_name(name);
  c.set_background(background);
  c.set_slo_ttft_ms(slo_ttft_ms);
  c.set_slo_itl_ms(slo_itl_ms);
  std::vector<double> ttft, itl, mean_itl, e2e;
  for (const RequestRecord* r : records) {
    c.set_requests(c.requests() + 1);
    if (!r->ok) {
      c.set_failures(c.failures() + 1);
      if (c.errors_size() < max_errors) c.add_errors(r->error.empty() ? "(no message)" : r->error);
      continue;
    }
    if (MeetsSlo(*r, slo_ttft_ms, slo_itl_ms)) c.set_good(c.good() + 1);
    c.set_prompt_tokens(c.prompt_tokens() + r->prompt_tokens);
    c.set_cached_prompt_tokens(c.cached_prompt_tokens() + r->cached_prompt_tokens);
    c.set_output_tokens(c.output_tokens() + static_cast<int64_t>(r->token_times.size()));
    if (r->path == 1) c.set_colocated(c.colocated() + 1);
    if (r->path == 2) c.set_disaggregated(c.disaggregated() + 1);
    c.set_drafted_tokens(c.drafted_tokens() + r->drafted_tokens);
    c.set_accepted_tokens(c.accepted_tokens() + r->accepted_tokens);
    if (r->stopped) c.set_stopped(c.stopped() + 1);
    c.set_edit_file_lines(c.edit_file_lines() + r->edit_file_lines);
    c.set_edit_lines_kept(c.edit_lines_kept() + r->edit_lines_kept);
    e2e.push_back(1000 * (r->end - r->start));
    if (r->token_times.empty()) continue;
    ttft.push_back(r->TtftMs());
    c.add_ttft_samples_ms(r->TtftMs());
    if (r->token_times.size() >= 2) c.add_itl_samples_ms(r->MeanItlMs());
    for (double gap_ms : TokenGapsMs(*r)) itl.push_back(gap_ms);
  }
  if (c.output_tokens() > c.accepted_tokens()) {
    c.set_tokens_per_step(static_cast<double>(c.output_tokens()) /
                          static_cast<double>(c.output_tokens() - c.accepted_tokens()));
  }
  *c.mutable_ttft_ms() = Summarize(ttft);
  *c.mutable_itl_ms() = Summarize(itl);
  *c.mutable_e2e_ms() = Summarize(e2e);
  if (wall_s > 0) {
    c.set_requests_per_s(static_cast<double>(c.requests() - c.failures()) / wall_s);
    c.set_output_tokens_per_s(static_cast<double>(c.output_tokens()) / wall_s);
    c.set_goodput_per_s(static_cast<double>(c.good()) / wall_s);
  }
  return c;
}

}  // namespace tandem::bench
