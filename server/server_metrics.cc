#include "server/server_metrics.h"

#include "absl/time/time.h"

namespace tandem::server {
namespace {

double Seconds(absl::Time from, absl::Time to) { return absl::ToDoubleSeconds(to - from); }

}  // namespace

prometheus::Histogram::BucketBoundaries ServerMetrics::LatencyBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

ServerMetrics::ServerMetrics(prometheus::Registry& registry)
    : requests_(prometheus::BuildCounter()
                    .Name("tandem_requests_total")
                    .Help("Finished generation requests, by finish reason and path.")
                    .Register(registry)),
      prompt_tokens_(prometheus::BuildCounter()
                         .Name("tandem_prompt_tokens_total")
                         .Help("Prompt tokens of finished requests.")
                         .Register(registry)
                         .Add({})),
      generated_tokens_(prometheus::BuildCounter()
                            .Name("tandem_generated_tokens_total")
                            .Help("Tokens generated for finished requests.")
                            .Register(registry)
                            .Add({})),
      rejected_(prometheus::BuildCounter()
                    .Name("tandem_rejected_requests_total")
                    .Help("Requests refused before queueing (invalid, queue full, draining).")
                    .Register(registry)
                    .Add({})),
      queue_time_(prometheus::BuildHistogram()
                      .Name("tandem_queue_time_seconds")
                      .Help("Arrival to first admission into a batch.")
                      .Register(registry)),
      time_to_first_token_(prometheus::BuildHistogram()
                               .Name("tandem_time_to_first_token_seconds")
                               .Help("Arrival to the first generated token.")
                               .Register(registry)),
      handoff_time_(prometheus::BuildHistogram()
                        .Name("tandem_handoff_time_seconds")
                        .Help("Handed to the decode worker to its first step there.")
                        .Register(registry)),
      end_to_end_(prometheus::BuildHistogram()
                      .Name("tandem_request_duration_seconds")
                      .Help("Arrival to the end of the request.")
                      .Register(registry)) {
  for (auto path : {scheduler::Path::kColocated, scheduler::Path::kDisaggregated}) {
    const std::string p(scheduler::PathName(path));
    for (auto reason : {scheduler::FinishReason::kStop, scheduler::FinishReason::kLength,
                        scheduler::FinishReason::kCancelled, scheduler::FinishReason::kError}) {
      requests_.Add(
          {{"finish_reason", std::string(scheduler::FinishReasonName(reason))}, {"path", p}});
    }
    queue_time_.Add({{"path", p}}, LatencyBuckets());
    time_to_first_token_.Add({{"path", p}}, LatencyBuckets());
    end_to_end_.Add({{"path", p}}, LatencyBuckets());
  }
  handoff_time_.Add({{"path", "disaggregated"}}, LatencyBuckets());
}

void ServerMetrics::OnFinish(const scheduler::FinishInfo& info) {
  const std::string path(scheduler::PathName(info.path));
  requests_
      .Add({{"finish_reason", std::string(scheduler::FinishReasonName(info.reason))},
            {"path", path}})
      .Increment();
  prompt_tokens_.Increment(info.usage.prompt_tokens);
  generated_tokens_.Increment(info.usage.completion_tokens);
  const scheduler::Timeline& t = info.timeline;
  if (t.scheduled != absl::InfinitePast()) {
    queue_time_.Add({{"path", path}}, LatencyBuckets()).Observe(Seconds(t.arrival, t.scheduled));
  }
  if (t.first_token != absl::InfinitePast()) {
    time_to_first_token_.Add({{"path", path}}, LatencyBuckets())
        .Observe(Seconds(t.arrival, t.first_token));
  }
  if (t.handoff_start != absl::InfinitePast() && t.handoff_end != absl::InfinitePast()) {
    handoff_time_.Add({{"path", path}}, LatencyBuckets())
        .Observe(Seconds(t.handoff_start, t.handoff_end));
  }
  end_to_end_.Add({{"path", path}}, LatencyBuckets()).Observe(Seconds(t.arrival, t.finished));
}

void ServerMetrics::OnRejected() { rejected_.Increment(); }

}  // namespace tandem::server
