#include "server/kv_memory_plan.h"

#include <algorithm>
#include <cmath>

#include "common/strings.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_config.h"

namespace tandem::server {

absl::StatusOr<KvMemoryPlan> PlanKvMemory(const model::GgufFile& model,
                                          const kernels::KvCacheShape& shape,
                                          const model::GgufFile* draft,
                                          const kernels::Backend& backend,
                                          int64_t decode_kv_cache_bytes, int64_t host_bytes) {
  KvMemoryPlan plan;
  absl::StatusOr<int64_t> weights = model::LlamaModel::WeightBytes(model, backend);
  if (!weights.ok()) return weights.status();
  plan.fixed_bytes = *weights + std::max<int64_t>(0, decode_kv_cache_bytes);
  if (backend.MemoryIsHost()) plan.fixed_bytes += std::max<int64_t>(0, host_bytes);
  plan.bytes_per_block = static_cast<int64_t>(shape.BytesPerBlock());
  if (draft != nullptr) {
    absl::StatusOr<int64_t> draft_weights = model::LlamaModel::WeightBytes(*draft, backend);
    absl::StatusOr<model::ModelConfig> config = model::ReadModelConfig(*draft);
    if (!draft_weights.ok() || !config.ok()) {
      const absl::Status& s = !draft_weights.ok() ? draft_weights.status() : config.status();
      return absl::Status(s.code(), StrCat("draft model '", draft->path(), "': ", s.message()));
    }
    kernels::KvCacheShape draft_shape = shape;
    draft_shape.layers = config->layers;
    draft_shape.kv_heads = config->kv_heads;
    draft_shape.head_dim = config->head_dim;
    plan.fixed_bytes += *draft_weights;
    plan.bytes_per_block += static_cast<int64_t>(draft_shape.BytesPerBlock());
  }
  return plan;
}

int64_t KvBlocksFromFreeMemory(double fraction, int64_t free_bytes, const KvMemoryPlan& plan) {
  const double spare = static_cast<double>(std::max<int64_t>(0, free_bytes - plan.fixed_bytes));
  return static_cast<int64_t>(
      std::floor(fraction * spare / static_cast<double>(plan.bytes_per_block)));
}

}  // namespace tandem::server
