#include "server/serving_model.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "common/strings.h"
#include "engine/kernels/cpu/cpu_backend.h"
#include "engine/model/llama_model.h"

namespace tandem::server {

absl::StatusOr<int64_t> AvailableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kib) == 1) return kib * 1024;
  }
  return absl::UnavailableError("cannot read MemAvailable from /proc/meminfo");
}

absl::StatusOr<std::unique_ptr<ServingModel>> ServingModel::Load(
    const ServingModelOptions& options) {
  std::unique_ptr<ServingModel> m(new ServingModel());
  absl::StatusOr<std::unique_ptr<model::GgufFile>> file = model::GgufFile::Open(options.model_path);
  if (!file.ok()) return file.status();
  m->file_ = std::shared_ptr<const model::GgufFile>(*std::move(file));

  absl::StatusOr<model::ModelConfig> config = model::ReadModelConfig(*m->file_);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        StrCat("model '", options.model_path, "': ", config.status().message()));
  }
  m->config_ = *config;
  absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tok =
      tokenizer::BpeTokenizer::FromGguf(*m->file_);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(), StrCat("model '", options.model_path,
                                                    "': tokenizer: ", tok.status().message()));
  }
  m->tokenizer_ = *std::move(tok);
  if (m->tokenizer_->vocab_size() != m->config_.vocab) {
    return absl::InvalidArgumentError(StrCat("model '", options.model_path, "': the tokenizer has ",
                                             m->tokenizer_->vocab_size(),
                                             " tokens but the embedding has ", m->config_.vocab));
  }
  std::optional<std::string_view> template_text;
  if (absl::StatusOr<std::string_view> t = m->file_->GetString("tokenizer.chat_template"); t.ok()) {
    template_text = *t;
  }
  absl::StatusOr<tokenizer::ChatTemplate> chat =
      tokenizer::ChatTemplate::Create(template_text, options.chat_template);
  if (!chat.ok()) {
    return absl::Status(chat.status().code(),
                        StrCat("model '", options.model_path, "': ", chat.status().message()));
  }
  m->chat_template_ = std::make_unique<tokenizer::ChatTemplate>(*std::move(chat));

  m->block_size_ = options.block_size;
  m->context_length_ = options.context_length > 0
                           ? std::min(options.context_length, m->config_.context_length)
                           : m->config_.context_length;
  kernels::KvCacheShape shape;
  shape.layers = m->config_.layers;
  shape.block_size = options.block_size;
  shape.kv_heads = m->config_.kv_heads;
  shape.head_dim = m->config_.head_dim;
  m->kv_blocks_ =
      static_cast<int>(options.kv_cache_bytes / static_cast<int64_t>(shape.BytesPerBlock()));
  const int min_blocks = (m->context_length_ + options.block_size - 1) / options.block_size;
  if (m->kv_blocks_ < min_blocks) {
    return absl::InvalidArgumentError(
        StrCat("--kv_cache_bytes=", options.kv_cache_bytes, " holds ", m->kv_blocks_,
               " blocks; one full-context sequence needs ", min_blocks, " (",
               static_cast<int64_t>(min_blocks) * static_cast<int64_t>(shape.BytesPerBlock()),
               " bytes); raise it or lower --context_length"));
  }

  auto backend = std::make_unique<kernels::cpu::CpuBackend>(options.threads, options.matmul_mode);
  m->backend_name_ = backend->name();
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> model =
      model::LlamaModel::Create(m->file_, backend.get(), m->kv_blocks_, options.block_size);
  if (!model.ok()) return model.status();
  m->worker_ = std::make_unique<prefill::PrefillWorker>(std::move(backend), *std::move(model));
  return m;
}

}  // namespace tandem::server
