#include "server/scheduler_collector.h"

#include <string>

namespace tandem::server {
namespace {

struct Sample {
  std::vector<prometheus::ClientMetric::Label> labels;
  double value;
};

prometheus::MetricFamily Family(std::string name, std::string help, prometheus::MetricType type,
                                std::vector<Sample> samples) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  for (Sample& sample : samples) {
    prometheus::ClientMetric metric;
    metric.label = std::move(sample.labels);
    if (type == prometheus::MetricType::Counter) {
      metric.counter.value = sample.value;
    } else {
      metric.gauge.value = sample.value;
    }
    family.metric.push_back(std::move(metric));
  }
  return family;
}

prometheus::MetricFamily Family(std::string name, std::string help, prometheus::MetricType type,
                                double value) {
  return Family(std::move(name), std::move(help), type, {Sample{{}, value}});
}

}  // namespace

std::vector<prometheus::MetricFamily> SchedulerCollector::Collect() const {
  const scheduler::SchedulerLoad load = scheduler_->Load();
  using prometheus::MetricType;
  const double total = load.kv.total_blocks;
  std::vector<prometheus::MetricFamily> families = {
      Family("tandem_start_time_seconds", "When the daemon started (Unix time).", MetricType::Gauge,
             absl::ToDoubleSeconds(start_ - absl::UnixEpoch())),
      Family("tandem_disagg_output_threshold",
             "--disagg_output_threshold in output tokens; -1 when disaggregation is off.",
             MetricType::Gauge, threshold_),
      Family("tandem_waiting_requests", "Requests queued, not yet running.", MetricType::Gauge,
             static_cast<double>(load.waiting)),
      Family("tandem_running_requests", "Sequences in a worker's running batch.", MetricType::Gauge,
             {Sample{{{"worker", "prefill"}}, static_cast<double>(load.running[0])},
              Sample{{{"worker", "decode"}}, static_cast<double>(load.running[1])}}),
      Family("tandem_remote_running_requests",
             "Requests this daemon handed to decode daemons that are still running there.",
             MetricType::Gauge, static_cast<double>(load.running_remote)),
      Family("tandem_kv_lease_expirations_total",
             "Handed-off requests whose KV pages' lease expired before the decode daemon had "
             "read them (they continued here).",
             MetricType::Counter, static_cast<double>(load.lease_expirations)),
      Family("tandem_handoffs_total",
             "Requests handed from the prefill worker to a decode worker (disaggregated).",
             MetricType::Counter, static_cast<double>(load.handoffs)),
      Family("tandem_preemptions_total",
             "Sequences preempted for KV space (recomputed later, mostly from the prefix cache).",
             MetricType::Counter, static_cast<double>(load.preemptions)),
      Family("tandem_kv_cache_blocks", "KV cache blocks in all.", MetricType::Gauge, total),
      Family("tandem_kv_cache_used_blocks", "KV cache blocks held by running sequences.",
             MetricType::Gauge, static_cast<double>(load.kv.used_blocks)),
      Family("tandem_kv_cache_usage_ratio", "Held KV blocks over all KV blocks (0..1).",
             MetricType::Gauge, total > 0 ? load.kv.used_blocks / total : 0.0),
      // Labels named as Kubernetes inference gateways read them (the
      // model-server protocol's cache-info metric); the value is always 1.
      Family("tandem_kv_cache_config_info",
             "The KV cache's shape: tokens per block and blocks in all (value 1).",
             MetricType::Gauge,
             {Sample{{{"block_size", std::to_string(block_size_)},
                      {"num_gpu_blocks", std::to_string(load.kv.total_blocks)}},
                     1.0}}),
      Family("tandem_kv_cache_cached_blocks",
             "KV blocks in the prefix index (held or free but not yet evicted).", MetricType::Gauge,
             load.kv.cached_blocks),
      Family("tandem_kv_cache_evictions_total",
             "Cached KV blocks evicted (least recently used first) to make room.",
             MetricType::Counter, static_cast<double>(load.kv.evictions)),
      Family("tandem_kv_cache_sliding_released_blocks_total",
             "KV blocks whose sliding-window layers' pages were given back, a whole window "
             "behind the sequence that held them (models with sliding-window layers).",
             MetricType::Counter, static_cast<double>(load.kv.sliding_released)),
      Family("tandem_prefix_cache_queried_tokens_total",
             "Prompt tokens looked up in the prefix cache at admission.", MetricType::Counter,
             static_cast<double>(load.kv.prefix_queried_tokens)),
      Family("tandem_prefix_cache_hit_tokens_total",
             "Prompt tokens found in the prefix cache (not recomputed).", MetricType::Counter,
             static_cast<double>(load.kv.prefix_hit_tokens)),
  };
  if (open_calls_) {
    families.push_back(Family("tandem_open_calls",
                              "Generation calls whose RPC is still open (queued, running, or "
                              "finishing their last write).",
                              MetricType::Gauge, static_cast<double>(open_calls_())));
  }
  families.push_back(Family("tandem_policy_info",
                            "The scheduling policy (--policy): slo or threshold; always 1.",
                            MetricType::Gauge, {Sample{{{"policy", policy_}}, 1.0}}));
  families.push_back(Family(
      "tandem_step_time_model_error_ratio",
      "The step-time model's mean relative error, |predicted - measured| / measured, over its "
      "last 64 steps (each predicted before it was learned from).",
      MetricType::Gauge, load.step_time_error));
  families.push_back(Family(
      "tandem_step_time_model_coefficient",
      "The fitted step-time model t = fixed + per_token * R(tokens) + per_kilo_read * (KV "
      "positions a sequence's first row reads / 1000) + per_kilo_shared_read * (positions "
      "its other rows read / 1000), R the backend's row curve, in seconds.",
      MetricType::Gauge,
      {Sample{{{"term", "fixed"}}, load.step_time.fixed / 1000},
       Sample{{{"term", "per_token"}}, load.step_time.per_token / 1000},
       Sample{{{"term", "per_kilo_read"}}, load.step_time.per_kilo_read / 1000},
       Sample{{{"term", "per_kilo_shared_read"}}, load.step_time.per_kilo_shared_read / 1000}}));
  if (load.least_slack_ms.has_value()) {
    families.push_back(Family("tandem_slo_slack_seconds",
                              "The least TPOT slack of the streams decoding here: how much "
                              "later than now the most pressed one's next token may come "
                              "(negative: late). Absent when nothing decodes.",
                              MetricType::Gauge, *load.least_slack_ms / 1000));
  }
  if (auto_costs_.has_value()) {
    families.push_back(Family(
        "tandem_disagg_auto_cost_seconds",
        "What --disagg_output_threshold=auto was set from, measured at start-up: a decode pass "
        "alone, a prompt-chunk step, and the chunk step with a decode token riding along.",
        MetricType::Gauge,
        {Sample{{{"measure", "decode_pass"}}, auto_costs_->decode_pass / 1000},
         Sample{{{"measure", "chunk_step"}}, auto_costs_->chunk_step / 1000},
         Sample{{{"measure", "chunk_with_decode"}}, auto_costs_->chunk_with_decode / 1000}}));
  }
  if (suffix_cache_ != nullptr) {
    const speculative::SuffixCache::Stats cache = suffix_cache_->stats();
    families.push_back(Family("tandem_speculation_cache_bytes",
                              "Bytes the suffix cache of recent requests' text holds, as its "
                              "budget (--speculation_cache_bytes) counts them.",
                              MetricType::Gauge, static_cast<double>(cache.bytes)));
    families.push_back(Family("tandem_speculation_cache_tokens",
                              "Tokens of recent requests' text the suffix cache holds.",
                              MetricType::Gauge, static_cast<double>(cache.tokens)));
    families.push_back(Family("tandem_speculation_cache_texts",
                              "Requests' texts (prompt and output) the suffix cache holds.",
                              MetricType::Gauge, static_cast<double>(cache.texts)));
    families.push_back(Family("tandem_speculation_cache_evictions_total",
                              "Texts evicted from the suffix cache to stay within its budget.",
                              MetricType::Counter, static_cast<double>(cache.evicted_texts)));
    families.push_back(Family("tandem_speculation_cache_refusals_total",
                              "Texts not kept in the suffix cache: larger than its budget alone.",
                              MetricType::Counter, static_cast<double>(cache.refused_texts)));
  }
  return families;
}

}  // namespace tandem::server
