#include "engine/model/model_config.h"

#include <filesystem>

#include "absl/status/status.h"
#include "common/strings.h"
#include "engine/kernels/sampling_arithmetic.h"

namespace tandem::model {
namespace {

constexpr int kMaxDimension = 1 << 20;

absl::Status ReadInt(const GgufFile& file, const std::string& key, int* out) {
  absl::StatusOr<uint64_t> v = file.GetUint(key);
  if (!v.ok()) return v.status();
  if (*v == 0 || *v > static_cast<uint64_t>(kMaxDimension) * 16) {
    return absl::InvalidArgumentError(
        StrCat("metadata key '", key, "' has value ", *v, ", outside the supported range"));
  }
  *out = static_cast<int>(*v);
  return absl::OkStatus();
}

absl::Status ReadOptionalInt(const GgufFile& file, const std::string& key, int* out) {
  return file.Has(key) ? ReadInt(file, key, out) : absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ReadModelConfig(const GgufFile& file, const ModelOverrides& overrides) {
  ModelConfig config;
  absl::StatusOr<std::string_view> arch = file.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  config.architecture = std::string(*arch);
  if (config.architecture == "llama") {
    config.rope_neox = false;
  } else if (config.architecture == "qwen2") {
    config.rope_neox = true;
  } else if (config.architecture == "qwen3") {
    config.rope_neox = true;
    config.qk_norm = true;
  } else if (config.architecture == "phi3") {
    // Fused attn_qkv and gate-and-up ffn_up, split at upload (LlamaModel).
    config.rope_neox = true;
    if (file.FindTensor("rope_factors_long.weight") != nullptr ||
        file.FindTensor("rope_factors_short.weight") != nullptr) {
      return absl::UnimplementedError(
          "phi3 with LongRoPE factors (rope_factors_long/short: the 128k-context models) is not "
          "supported; the 4k-context models are");
    }
  } else {
    return absl::UnimplementedError(
        StrCat("model architecture '", config.architecture,
               "' is not supported (supported: llama, qwen2, qwen3, phi3)"));
  }
  absl::StatusOr<std::string_view> name = file.GetString("general.name");
  config.name = name.ok() ? std::string(*name) : std::filesystem::path(file.path()).stem().string();

  const std::string p = config.architecture + ".";
  for (auto [key, field] :
       {std::pair{"block_count", &config.layers}, std::pair{"embedding_length", &config.embedding},
        std::pair{"feed_forward_length", &config.ffn},
        std::pair{"attention.head_count", &config.heads},
        std::pair{"context_length", &config.context_length}}) {
    if (absl::Status s = ReadInt(file, p + key, field); !s.ok()) return s;
  }
  config.kv_heads = config.heads;
  if (absl::Status s = ReadOptionalInt(file, p + "attention.head_count_kv", &config.kv_heads);
      !s.ok()) {
    return s;
  }
  if (config.embedding % config.heads != 0) {
    return absl::InvalidArgumentError(StrCat("embedding_length ", config.embedding,
                                             " is not divisible by head_count ", config.heads));
  }
  config.head_dim = config.embedding / config.heads;
  if (absl::Status s = ReadOptionalInt(file, p + "attention.key_length", &config.head_dim);
      !s.ok()) {
    return s;
  }
  if (config.heads % config.kv_heads != 0) {
    return absl::InvalidArgumentError(StrCat(
        "head_count ", config.heads, " is not a multiple of head_count_kv ", config.kv_heads));
  }
  config.rotary_dims = config.head_dim;
  if (absl::Status s = ReadOptionalInt(file, p + "rope.dimension_count", &config.rotary_dims);
      !s.ok()) {
    return s;
  }
  if (config.rotary_dims > config.head_dim || config.rotary_dims % 2 != 0) {
    return absl::InvalidArgumentError(StrCat("rope.dimension_count ", config.rotary_dims,
                                             " must be even and at most the head size ",
                                             config.head_dim));
  }
  if (file.Has(p + "rope.freq_base")) {
    absl::StatusOr<double> base = file.GetFloat(p + "rope.freq_base");
    if (!base.ok()) return base.status();
    if (!(*base > 1.0)) {
      return absl::InvalidArgumentError(StrCat("rope.freq_base ", *base, " must be > 1"));
    }
    config.rope_base = static_cast<float>(*base);
  }
  if (file.Has(p + "attention.layer_norm_rms_epsilon")) {
    absl::StatusOr<double> eps = file.GetFloat(p + "attention.layer_norm_rms_epsilon");
    if (!eps.ok()) return eps.status();
    if (!(*eps > 0.0 && *eps < 1.0)) {
      return absl::InvalidArgumentError(
          StrCat("attention.layer_norm_rms_epsilon ", *eps, " must be in (0, 1)"));
    }
    config.norm_eps = static_cast<float>(*eps);
  }
  const GgufTensor* embeddings = file.FindTensor("token_embd.weight");
  if (embeddings == nullptr || embeddings->dims.size() != 2) {
    return absl::InvalidArgumentError("tensor 'token_embd.weight' is missing or not a matrix");
  }
  if (embeddings->dims[1] < 1 ||
      embeddings->dims[1] > kernels::sampling_arithmetic::kMaxVocabulary) {
    return absl::InvalidArgumentError(StrCat(
        "a vocabulary of ", embeddings->dims[1], " tokens (token_embd.weight) is outside 1..",
        kernels::sampling_arithmetic::kMaxVocabulary, ", what the sampler supports"));
  }
  config.vocab = static_cast<int>(embeddings->dims[1]);
  if (overrides.rope_base) config.rope_base = *overrides.rope_base;
  if (overrides.norm_eps) config.norm_eps = *overrides.norm_eps;
  if (overrides.rope_neox) config.rope_neox = *overrides.rope_neox;
  if (overrides.context_length) {
    if (*overrides.context_length < 1) {
      return absl::InvalidArgumentError("the context length override must be at least 1");
    }
    config.context_length = *overrides.context_length;
  }
  return config;
}

}  // namespace tandem::model
