// The daemon's Prometheus metrics (docs/metrics.md lists every one).
//
// Thread safety: all methods may be called from any thread.
#ifndef TANDEM_SERVER_SERVER_METRICS_H_
#define TANDEM_SERVER_SERVER_METRICS_H_

#include <memory>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "scheduler/request.h"

namespace tandem::server {

class ServerMetrics {
 public:
  explicit ServerMetrics(prometheus::Registry& registry);

  // Records a finished request from its timeline and usage.
  void OnFinish(const scheduler::FinishInfo& info);
  // Records a request rejected before it was queued (bad input, full queue).
  void OnRejected();

  // Latency buckets in seconds, chosen to resolve both a CPU (tens of ms per
  // token, seconds per long prompt) and a GPU (ms per token).
  static prometheus::Histogram::BucketBoundaries LatencyBuckets();

 private:
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generated_tokens_;
  prometheus::Counter& rejected_;
  // Per-phase latency, labelled by path.
  prometheus::Family<prometheus::Histogram>& queue_time_;
  prometheus::Family<prometheus::Histogram>& time_to_first_token_;
  prometheus::Family<prometheus::Histogram>& handoff_time_;
  prometheus::Family<prometheus::Histogram>& end_to_end_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_SERVER_METRICS_H_
