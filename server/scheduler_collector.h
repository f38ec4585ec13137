// Exposes the scheduler's and KV cache's state to Prometheus, read at scrape
// time from Scheduler::Load() (so it costs nothing between scrapes).
#ifndef TANDEM_SERVER_SCHEDULER_COLLECTOR_H_
#define TANDEM_SERVER_SCHEDULER_COLLECTOR_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "engine/speculative/suffix_cache.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "scheduler/scheduler.h"

namespace tandem::server {

class SchedulerCollector final : public prometheus::Collectable {
 public:
  // `scheduler` must outlive the collector's registration. `block_size` is
  // the KV cache's tokens per block. `threshold` is
  // --disagg_output_threshold (-1: off), exported for `tandem shape`;
  // `auto_costs`, when set, what the auto threshold was measured from.
  // `open_calls`, when set, counts the generation calls still open.
  // `policy`: "slo" or "threshold" (--policy), exported as
  // tandem_policy_info.
  SchedulerCollector(const scheduler::Scheduler* scheduler, int32_t block_size,
                     int32_t disagg_threshold,
                     std::optional<scheduler::DisaggregationCosts> auto_costs = std::nullopt,
                     std::function<int64_t()> open_calls = nullptr,
                     std::string policy = "threshold")
      : scheduler_(scheduler),
        block_size_(block_size),
        threshold_(disagg_threshold),
        auto_costs_(auto_costs),
        open_calls_(std::move(open_calls)),
        policy_(std::move(policy)),
        start_(absl::Now()) {}

  // Also exports the suffix cache's size and evictions (before the
  // collector is registered).
  void set_suffix_cache(std::shared_ptr<const speculative::SuffixCache> cache) {
    suffix_cache_ = std::move(cache);
  }

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const scheduler::Scheduler* scheduler_;
  int32_t block_size_;
  int32_t threshold_;
  std::optional<scheduler::DisaggregationCosts> auto_costs_;
  std::function<int64_t()> open_calls_;
  std::string policy_;
  std::shared_ptr<const speculative::SuffixCache> suffix_cache_;
  absl::Time start_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_SCHEDULER_COLLECTOR_H_
