// Exposes the scheduler's and KV cache's state to Prometheus, read at scrape
// time from Scheduler::Load() (so it costs nothing between scrapes).
#ifndef TANDEM_SERVER_SCHEDULER_COLLECTOR_H_
#define TANDEM_SERVER_SCHEDULER_COLLECTOR_H_

#include <vector>

#include "absl/time/clock.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "scheduler/scheduler.h"

namespace tandem::server {

class SchedulerCollector final : public prometheus::Collectable {
 public:
  // `scheduler` must outlive the collector's registration. `threshold` is
  // --disagg_output_threshold (-1: off), exported for `tandem shape`.
  SchedulerCollector(const scheduler::Scheduler* scheduler, int32_t disagg_threshold)
      : scheduler_(scheduler), threshold_(disagg_threshold), start_(absl::Now()) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const scheduler::Scheduler* scheduler_;
  int32_t threshold_;
  absl::Time start_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_SCHEDULER_COLLECTOR_H_
