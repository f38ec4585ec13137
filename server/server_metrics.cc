#include "server/server_metrics.h"

#include "absl/time/time.h"

namespace tandem::server {
namespace {

double Seconds(absl::Time from, absl::Time to) { return absl::ToDoubleSeconds(to - from); }

// What ended a cancelled request, from the status the scheduler finished it
// with: its deadline, the daemon stopping, or its client (gone, or cancelled).
std::string CancelCause(const absl::Status& why) {
  if (absl::IsDeadlineExceeded(why)) return "deadline";
  if (absl::IsUnavailable(why)) return "shutdown";
  return "client";
}

constexpr scheduler::Stage kStages[] = {scheduler::Stage::kQueued, scheduler::Stage::kPrefill,
                                        scheduler::Stage::kHandoff, scheduler::Stage::kDecode};

}  // namespace

prometheus::Histogram::BucketBoundaries ServerMetrics::LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

prometheus::Histogram::BucketBoundaries ServerMetrics::StartDelayBuckets() {
  return {0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1};
}

prometheus::Histogram::BucketBoundaries ServerMetrics::TokenBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 1; v <= 32768; v *= 2) b.push_back(v);
  return b;
}

prometheus::Histogram::BucketBoundaries ServerMetrics::AcceptedLengthBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 0; v <= 16; ++v) b.push_back(v);
  for (double v : {20, 24, 28, 32, 48, 64}) b.push_back(v);  // long suffix copies
  return b;
}

namespace {

prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& registry,
                                                       const std::string& name,
                                                       const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Histogram>& HistogramFamily(prometheus::Registry& registry,
                                                           const std::string& name,
                                                           const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
}

}  // namespace

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
      cancelled_(prometheus::BuildCounter()
                     .Name("tandem_cancelled_requests_total")
                     .Help("Cancelled requests by the stage they were in and by cause (client, "
                           "deadline, shutdown).")
                     .Register(registry)),
      slow_reader_cancellations_(prometheus::BuildCounter()
                                     .Name("tandem_slow_reader_cancellations_total")
                                     .Help("Streams cancelled because the client read nothing "
                                           "for --slow_reader_timeout.")
                                     .Register(registry)
                                     .Add({})),
      unauthenticated_(prometheus::BuildCounter()
                           .Name("tandem_unauthenticated_calls_total")
                           .Help("Calls refused for a missing or wrong API key.")
                           .Register(registry)
                           .Add({})),
      http_responses_(prometheus::BuildCounter()
                          .Name("tandem_http_responses_total")
                          .Help("HTTP API responses by route and status code (a stream counts "
                                "once, with the status its head carried).")
                          .Register(registry)),
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
      kv_transfer_time_(HistogramFamily(registry, "tandem_kv_transfer_time_seconds",
                                        "Per request decoded on another daemon: from offering "
                                        "its KV pages until the decode daemon had read them all "
                                        "(part of the handoff).")),
      kv_transfer_bytes_(CounterFamily(registry, "tandem_kv_transfer_bytes_total",
                                       "KV page bytes moved between daemons: direction in "
                                       "(pulled into this daemon) or out (pulled from it).")),
      kv_transfer_failures_(CounterFamily(registry, "tandem_kv_transfer_failures_total",
                                          "Handoffs between daemons that moved no usable pages, "
                                          "by direction and reason.")),
      remote_handoffs_(CounterFamily(registry, "tandem_remote_handoffs_total",
                                     "Requests handed to decode daemons, by peer and outcome.")),
      slo_attainment_(CounterFamily(
          registry, "tandem_slo_attainment_total",
          "Requests that ended by themselves (stop or length), by SLO (ttft; tpot, for those "
          "with two tokens or more) and whether they met their latency budget.")),
      step_predicted_(
          CounterFamily(registry, "tandem_step_predicted_seconds_total",
                        "Step time the step-time model predicted at dispatch, summed over steps.")),
      step_compute_(CounterFamily(registry, "tandem_step_compute_seconds_total",
                                  "Compute time steps had (duration less the wait for the shared "
                                  "compute and what they yielded to the other worker).")),
      prefill_time_(HistogramFamily(registry, "tandem_prefill_time_seconds",
                                    "First admission to the first generated token.")),
      decode_time_(HistogramFamily(registry, "tandem_decode_time_seconds",
                                   "First generated token to the end, less the handoff.")),
      inter_token_(HistogramFamily(registry, "tandem_inter_token_latency_seconds",
                                   "Time between consecutive generated tokens of a request.")),
      end_to_end_(prometheus::BuildHistogram()
                      .Name("tandem_request_duration_seconds")
                      .Help("Arrival to the end of the request.")
                      .Register(registry)),
      request_prompt_tokens_(HistogramFamily(registry, "tandem_request_prompt_tokens",
                                             "Prompt tokens per finished request.")
                                 .Add({}, TokenBuckets())),
      request_generated_tokens_(HistogramFamily(registry, "tandem_request_generated_tokens",
                                                "Generated tokens per finished request.")
                                    .Add({}, TokenBuckets())),
      step_tokens_(HistogramFamily(registry, "tandem_step_tokens",
                                   "Tokens per worker step (batch size in tokens).")),
      step_sequences_(HistogramFamily(registry, "tandem_step_sequences",
                                      "Sequences per worker step (batch size in sequences).")),
      step_time_(HistogramFamily(registry, "tandem_step_time_seconds",
                                 "Duration of a worker step, dispatch to results.")),
      decode_start_delay_(
          HistogramFamily(registry, "tandem_decode_start_delay_seconds",
                          "How long a decode-worker step waited for the shared compute to "
                          "leave a running prefill step (0 when none ran).")
              .Add({}, StartDelayBuckets())),
      prefill_yielded_(CounterFamily(registry, "tandem_prefill_yielded_seconds_total",
                                     "Time prefill-worker steps yielded the shared compute to "
                                     "decode-worker steps.")
                           .Add({})),
      drafted_tokens_(CounterFamily(registry, "tandem_speculative_drafted_tokens_total",
                                    "Tokens drafted by speculative decoding and verified, by "
                                    "proposer and by what the draft copied (source).")),
      accepted_tokens_(CounterFamily(registry, "tandem_speculative_accepted_tokens_total",
                                     "Drafted tokens the model accepted, by proposer and "
                                     "source.")),
      accepted_length_(HistogramFamily(registry, "tandem_speculative_accepted_length",
                                       "Drafted tokens accepted per verification (a decode "
                                       "step yields this plus one).")),
      position_drafted_(CounterFamily(registry, "tandem_speculative_position_drafted_total",
                                      "Drafted tokens by their position in the draft (1 = "
                                      "first).")),
      position_accepted_(CounterFamily(registry, "tandem_speculative_position_accepted_total",
                                       "Accepted drafted tokens by their position in the "
                                       "draft.")) {
  for (auto path : {scheduler::Path::kColocated, scheduler::Path::kDisaggregated}) {
    const std::string p(scheduler::PathName(path));
    for (auto reason : {scheduler::FinishReason::kStop, scheduler::FinishReason::kLength,
                        scheduler::FinishReason::kCancelled, scheduler::FinishReason::kError}) {
      requests_.Add(
          {{"finish_reason", std::string(scheduler::FinishReasonName(reason))}, {"path", p}});
    }
    for (auto* family : {&queue_time_, &time_to_first_token_, &prefill_time_, &decode_time_,
                         &inter_token_, &end_to_end_}) {
      family->Add({{"path", p}}, LatencyBuckets());
    }
  }
  for (const char* slo : {"ttft", "tpot"}) {
    for (const char* met : {"true", "false"}) slo_attainment_.Add({{"slo", slo}, {"met", met}});
  }
  for (const char* worker : {"prefill", "decode"}) {
    step_predicted_.Add({{"worker", worker}});
    step_compute_.Add({{"worker", worker}});
    step_tokens_.Add({{"worker", worker}}, TokenBuckets());
    step_sequences_.Add({{"worker", worker}}, TokenBuckets());
    step_time_.Add({{"worker", worker}}, LatencyBuckets());
  }
  handoff_time_.Add({{"path", "disaggregated"}}, LatencyBuckets());
  for (const char* direction : {"in", "out"}) kv_transfer_bytes_.Add({{"direction", direction}});
  for (scheduler::Stage stage : kStages) {
    for (const char* cause : {"client", "deadline", "shutdown"}) {
      cancelled_.Add({{"stage", std::string(scheduler::StageName(stage))}, {"cause", cause}});
    }
  }
  for (auto proposer :
       {step::Proposer::kNgram, step::Proposer::kSuffix, step::Proposer::kDraftModel}) {
    const std::string name(scheduler::ProposerName(proposer));
    accepted_length_.Add({{"proposer", name}}, AcceptedLengthBuckets());
  }
  for (auto [proposer, source] :
       {std::pair{step::Proposer::kNgram, step::DraftSource::kRequest},
        std::pair{step::Proposer::kSuffix, step::DraftSource::kRequest},
        std::pair{step::Proposer::kSuffix, step::DraftSource::kGlobal},
        std::pair{step::Proposer::kDraftModel, step::DraftSource::kModel}}) {
    const prometheus::Labels labels = {{"proposer", std::string(scheduler::ProposerName(proposer))},
                                       {"source", std::string(scheduler::DraftSourceName(source))}};
    drafted_tokens_.Add(labels);
    accepted_tokens_.Add(labels);
  }
}

void ServerMetrics::OnStep(const scheduler::StepStats& step) {
  const std::string worker(scheduler::LaneName(step.lane));
  step_tokens_.Add({{"worker", worker}}, TokenBuckets()).Observe(static_cast<double>(step.tokens));
  step_sequences_.Add({{"worker", worker}}, TokenBuckets()).Observe(step.sequences);
  step_time_.Add({{"worker", worker}}, LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(step.duration));
  step_predicted_.Add({{"worker", worker}}).Increment(absl::ToDoubleSeconds(step.predicted));
  step_compute_.Add({{"worker", worker}})
      .Increment(std::max(0.0, absl::ToDoubleSeconds(step.compute)));
  if (step.lane == scheduler::Lane::kDecode) {
    decode_start_delay_.Observe(absl::ToDoubleSeconds(step.start_delay));
  } else {
    prefill_yielded_.Increment(absl::ToDoubleSeconds(step.yielded));
  }
  for (const scheduler::StepStats::Verification& v : step.verifications) {
    const std::string proposer(scheduler::ProposerName(v.proposer));
    const prometheus::Labels by_source = {
        {"proposer", proposer}, {"source", std::string(scheduler::DraftSourceName(v.source))}};
    drafted_tokens_.Add(by_source).Increment(v.drafted);
    accepted_tokens_.Add(by_source).Increment(v.accepted);
    accepted_length_.Add({{"proposer", proposer}}, AcceptedLengthBuckets()).Observe(v.accepted);
    for (int32_t position = 1; position <= v.drafted; ++position) {
      const std::string p = std::to_string(position);
      position_drafted_.Add({{"proposer", proposer}, {"position", p}}).Increment();
      if (position <= v.accepted) {
        position_accepted_.Add({{"proposer", proposer}, {"position", p}}).Increment();
      }
    }
  }
}

void ServerMetrics::OnFinish(const scheduler::FinishInfo& info,
                             const std::vector<double>& token_gaps, bool from_client) {
  const std::string path(scheduler::PathName(info.path));
  requests_
      .Add({{"finish_reason", std::string(scheduler::FinishReasonName(info.reason))},
            {"path", path}})
      .Increment();
  if (info.reason == scheduler::FinishReason::kCancelled) {
    cancelled_
        .Add({{"stage", std::string(scheduler::StageName(info.stage))},
              {"cause", CancelCause(info.error)}})
        .Increment();
  }
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
  if (t.kv_transfer_start != absl::InfinitePast() && t.kv_transfer_end != absl::InfinitePast()) {
    kv_transfer_time_.Add({{"path", path}}, LatencyBuckets())
        .Observe(Seconds(t.kv_transfer_start, t.kv_transfer_end));
  }
  end_to_end_.Add({{"path", path}}, LatencyBuckets()).Observe(Seconds(t.arrival, t.finished));
  if (t.scheduled != absl::InfinitePast() && t.first_token != absl::InfinitePast()) {
    prefill_time_.Add({{"path", path}}, LatencyBuckets())
        .Observe(Seconds(t.scheduled, t.first_token));
    const double handoff =
        t.handoff_start != absl::InfinitePast() && t.handoff_end != absl::InfinitePast()
            ? Seconds(t.handoff_start, t.handoff_end)
            : 0.0;
    decode_time_.Add({{"path", path}}, LatencyBuckets())
        .Observe(Seconds(t.first_token, t.finished) - handoff);
  }
  prometheus::Histogram& itl = inter_token_.Add({{"path", path}}, LatencyBuckets());
  for (double gap : token_gaps) itl.Observe(gap);
  request_prompt_tokens_.Observe(info.usage.prompt_tokens);
  request_generated_tokens_.Observe(info.usage.completion_tokens);
  const bool ended_by_itself = info.reason == scheduler::FinishReason::kStop ||
                               info.reason == scheduler::FinishReason::kLength;
  if (from_client && ended_by_itself && t.first_token != absl::InfinitePast()) {
    auto count = [&](const char* slo, bool met) {
      slo_attainment_.Add({{"slo", slo}, {"met", met ? "true" : "false"}}).Increment();
    };
    count("ttft", t.first_token - t.arrival <= info.slo.ttft);
    if (info.usage.completion_tokens >= 2) {
      const absl::Duration tpot = (t.finished - t.first_token) / (info.usage.completion_tokens - 1);
      count("tpot", tpot <= info.slo.tpot);
    }
  }
}

void ServerMetrics::OnRejected() { rejected_.Increment(); }

void ServerMetrics::OnKvTransfer(const std::string& direction, uint64_t bytes) {
  kv_transfer_bytes_.Add({{"direction", direction}}).Increment(static_cast<double>(bytes));
}

void ServerMetrics::OnKvTransferFailure(const std::string& direction, const std::string& reason) {
  kv_transfer_failures_.Add({{"direction", direction}, {"reason", reason}}).Increment();
}

void ServerMetrics::OnRemoteHandoff(const std::string& peer, const std::string& outcome) {
  remote_handoffs_.Add({{"peer", peer}, {"outcome", outcome}}).Increment();
}

void ServerMetrics::OnUnauthenticated() { unauthenticated_.Increment(); }

void ServerMetrics::OnSlowReaderCancelled() { slow_reader_cancellations_.Increment(); }

void ServerMetrics::OnHttpResponse(const std::string& route, int status) {
  http_responses_.Add({{"route", route}, {"code", std::to_string(status)}}).Increment();
}

}  // namespace tandem::server
