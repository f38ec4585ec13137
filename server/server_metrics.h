// The daemon's Prometheus metrics (docs/metrics.md lists every one).
//
// Thread safety: all methods may be called from any thread.
#ifndef TANDEM_SERVER_SERVER_METRICS_H_
#define TANDEM_SERVER_SERVER_METRICS_H_

#include <memory>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "scheduler/request.h"
#include "scheduler/scheduler.h"

namespace tandem::server {

class ServerMetrics {
 public:
  explicit ServerMetrics(prometheus::Registry& registry);

  // Records a finished request from its timeline and usage, and the gaps
  // between its consecutive tokens (seconds). `from_client`: the request
  // came from a client here (not taken over from a prefill daemon, whose
  // own metrics count its SLOs).
  void OnFinish(const scheduler::FinishInfo& info, const std::vector<double>& token_gaps,
                bool from_client = true);
  // Records one worker step.
  void OnStep(const scheduler::StepStats& step);
  // Records a request rejected before it was queued (bad input, full queue).
  void OnRejected();
  // Records a call refused for a missing or wrong API key.
  void OnUnauthenticated();
  // Records a stream cancelled because its client stopped reading.
  void OnSlowReaderCancelled();
  // Records an HTTP API response: `route` the path served ("/v1/models"
  // for /v1/models/{id}; "other" for unknown paths), `status` its code.
  void OnHttpResponse(const std::string& route, int status);
  // KV transfer between daemons: `direction` "in" (pages pulled into this
  // daemon) or "out" (pulled from it).
  void OnKvTransfer(const std::string& direction, uint64_t bytes);
  void OnKvTransferFailure(const std::string& direction, const std::string& reason);
  // A request handed to decode daemon `peer` (an address, or "none"):
  // outcome "committed" (its pages moved), "lease_expired", "failed" (the
  // peer ended it with an error: it continued here) or "no_peer".
  void OnRemoteHandoff(const std::string& peer, const std::string& outcome);

  // Latency buckets in seconds, chosen to resolve both a CPU (tens of ms per
  // token, seconds per long prompt) and a GPU (ms per token).
  static prometheus::Histogram::BucketBoundaries LatencyBuckets();
  // Token counts per request and per step: powers of two, 1 to 32768.
  static prometheus::Histogram::BucketBoundaries TokenBuckets();
  // 10 us to 100 ms: a decode step's wait for the compute.
  static prometheus::Histogram::BucketBoundaries StartDelayBuckets();
  // Accepted drafted tokens per verification: 0, 1, 2, ... 16, then 20,
  // 24, 28, 32, 48, 64.
  static prometheus::Histogram::BucketBoundaries AcceptedLengthBuckets();

 private:
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generated_tokens_;
  prometheus::Counter& rejected_;
  // Cancelled requests by the stage they left and by what ended them.
  prometheus::Family<prometheus::Counter>& cancelled_;
  prometheus::Counter& slow_reader_cancellations_;
  prometheus::Counter& unauthenticated_;
  prometheus::Family<prometheus::Counter>& http_responses_;
  // Per-phase latency, labelled by path.
  prometheus::Family<prometheus::Histogram>& queue_time_;
  prometheus::Family<prometheus::Histogram>& time_to_first_token_;
  prometheus::Family<prometheus::Histogram>& handoff_time_;
  prometheus::Family<prometheus::Histogram>& kv_transfer_time_;
  // Several daemons: KV pages moved, failures, handoffs by peer.
  prometheus::Family<prometheus::Counter>& kv_transfer_bytes_;
  prometheus::Family<prometheus::Counter>& kv_transfer_failures_;
  prometheus::Family<prometheus::Counter>& remote_handoffs_;
  prometheus::Family<prometheus::Counter>& slo_attainment_;
  prometheus::Family<prometheus::Counter>& step_predicted_;
  prometheus::Family<prometheus::Counter>& step_compute_;
  prometheus::Family<prometheus::Histogram>& prefill_time_;
  prometheus::Family<prometheus::Histogram>& decode_time_;
  prometheus::Family<prometheus::Histogram>& inter_token_;
  prometheus::Family<prometheus::Histogram>& end_to_end_;
  // The token shape of the traffic (tandem shape reads these).
  prometheus::Histogram& request_prompt_tokens_;
  prometheus::Histogram& request_generated_tokens_;
  // Per worker kind.
  prometheus::Family<prometheus::Histogram>& step_tokens_;
  prometheus::Family<prometheus::Histogram>& step_sequences_;
  prometheus::Family<prometheus::Histogram>& step_time_;
  // Shared compute: the decode worker's wait for it, the prefill worker's
  // time without it.
  prometheus::Histogram& decode_start_delay_;
  prometheus::Counter& prefill_yielded_;
  // Speculative decoding, per proposer (and source, or draft position).
  prometheus::Family<prometheus::Counter>& drafted_tokens_;
  prometheus::Family<prometheus::Counter>& accepted_tokens_;
  prometheus::Family<prometheus::Histogram>& accepted_length_;
  prometheus::Family<prometheus::Counter>& position_drafted_;
  prometheus::Family<prometheus::Counter>& position_accepted_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_SERVER_METRICS_H_
