#include "server/scheduler_collector.h"

#include <string>

namespace tandem::server {
namespace {

prometheus::MetricFamily Family(std::string name, std::string help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

}  // namespace

std::vector<prometheus::MetricFamily> SchedulerCollector::Collect() const {
  const scheduler::SchedulerLoad load = scheduler_->Load();
  using prometheus::MetricType;
  const double total = load.kv.total_blocks;
  return {
      Family("tandem_waiting_requests", "Requests queued, not yet running.", MetricType::Gauge,
             load.waiting),
      Family("tandem_running_requests", "Sequences in the running batch.", MetricType::Gauge,
             load.running),
      Family("tandem_preemptions_total",
             "Sequences preempted for KV space (recomputed later, mostly from the prefix cache).",
             MetricType::Counter, static_cast<double>(load.preemptions)),
      Family("tandem_kv_cache_blocks", "KV cache blocks in all.", MetricType::Gauge, total),
      Family("tandem_kv_cache_used_blocks", "KV cache blocks held by running sequences.",
             MetricType::Gauge, load.kv.used_blocks),
      Family("tandem_kv_cache_usage_ratio", "Held KV blocks over all KV blocks (0..1).",
             MetricType::Gauge, total > 0 ? load.kv.used_blocks / total : 0.0),
      Family("tandem_kv_cache_cached_blocks",
             "KV blocks in the prefix index (held or free but not yet evicted).", MetricType::Gauge,
             load.kv.cached_blocks),
      Family("tandem_kv_cache_evictions_total",
             "Cached KV blocks evicted (least recently used first) to make room.",
             MetricType::Counter, static_cast<double>(load.kv.evictions)),
      Family("tandem_prefix_cache_queried_tokens_total",
             "Prompt tokens looked up in the prefix cache at admission.", MetricType::Counter,
             static_cast<double>(load.kv.prefix_queried_tokens)),
      Family("tandem_prefix_cache_hit_tokens_total",
             "Prompt tokens found in the prefix cache (not recomputed).", MetricType::Counter,
             static_cast<double>(load.kv.prefix_hit_tokens)),
  };
}

}  // namespace tandem::server
