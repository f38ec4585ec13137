#include "engine/model/model_config.h"

#include <cmath>
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

// A positive float key, if present.
absl::Status ReadOptionalPositive(const GgufFile& file, const std::string& key, float* out) {
  if (!file.Has(key)) return absl::OkStatus();
  absl::StatusOr<double> v = file.GetFloat(key);
  if (!v.ok()) return v.status();
  if (!(*v > 0.0 && *v < 1e30)) {
    return absl::InvalidArgumentError(
        StrCat("metadata key '", key, "' is ", *v, "; it must be positive"));
  }
  *out = static_cast<float>(*v);
  return absl::OkStatus();
}

// Which layers slide: attention.sliding_window_pattern as one bool a layer,
// or as a period n (every n-th layer, the last of each n, is global), or
// `default_period` without the key; as llama.cpp reads it.
absl::Status ReadSlidingLayers(const GgufFile& file, const std::string& p, int default_period,
                               ModelConfig& config) {
  const std::string key = p + "attention.sliding_window_pattern";
  config.sliding_layers.assign(static_cast<size_t>(config.layers), false);
  const GgufValue* v = file.Find(key);
  if (v != nullptr && v->type == GgufType::kArray) {
    if (v->elements.size() != static_cast<size_t>(config.layers)) {
      return absl::InvalidArgumentError(StrCat("metadata key '", key, "' has ", v->elements.size(),
                                               " values for ", config.layers, " layers"));
    }
    for (size_t i = 0; i < v->elements.size(); ++i) {
      const bool* b = std::get_if<bool>(&v->elements[i].scalar);
      if (b == nullptr) {
        return absl::InvalidArgumentError(StrCat("metadata key '", key, "' must hold bools"));
      }
      config.sliding_layers[i] = *b;
    }
    return absl::OkStatus();
  }
  int period = default_period;
  if (absl::Status s = ReadOptionalInt(file, key, &period); !s.ok()) return s;
  for (int i = 0; i < config.layers; ++i) {
    config.sliding_layers[static_cast<size_t>(i)] = i % period < period - 1;
  }
  return absl::OkStatus();
}

// Qwen3-MoE and OLMoE: the experts (keys as llama.cpp's converter writes
// them; Qwen3-MoE renormalises the chosen experts' weights, OLMoE does not,
// as llama.cpp decides by architecture unless the file says).
absl::Status ReadMoeConfig(const GgufFile& file, const std::string& p, ModelConfig& config) {
  config.qk_norm = true;
  config.qk_norm_whole = config.architecture == "olmoe";
  config.expert_weights_norm = config.architecture == "qwen3moe";
  if (auto s = ReadInt(file, p + "expert_count", &config.experts); !s.ok()) return s;
  if (auto s = ReadInt(file, p + "expert_used_count", &config.experts_used); !s.ok()) return s;
  constexpr int kMaxExperts = 512;
  if (config.experts > kMaxExperts || config.experts_used > config.experts) {
    return absl::InvalidArgumentError(
        StrCat("expert_used_count ", config.experts_used, " of expert_count ", config.experts,
               ": at most ", kMaxExperts, " experts, of which at most all are used"));
  }
  config.expert_ffn = config.ffn;
  if (auto s = ReadOptionalInt(file, p + "expert_feed_forward_length", &config.expert_ffn);
      !s.ok()) {
    return s;
  }
  if (file.Has(p + "expert_weights_norm")) {
    absl::StatusOr<bool> norm = file.GetBool(p + "expert_weights_norm");
    if (!norm.ok()) return norm.status();
    config.expert_weights_norm = *norm;
  }
  return ReadOptionalPositive(file, p + "expert_weights_scale", &config.expert_weights_scale);
}

// Gemma 2 and 3 (the keys llama.cpp's converter writes; its defaults where
// a key is missing).
absl::Status ReadGemmaConfig(const GgufFile& file, const std::string& p, ModelConfig& config) {
  const bool gemma2 = config.architecture == "gemma2";
  config.activation = ModelConfig::Activation::kGeluTanh;
  config.embedding_scale = std::sqrt(static_cast<float>(config.embedding));
  config.post_norms = true;
  config.qk_norm = !gemma2;
  // Published 27B models (46 layers of Gemma 2, 62 of Gemma 3) scale by
  // their query_pre_attn_scalar, embedding / heads, which GGUF does not keep.
  if (config.layers == (gemma2 ? 46 : 62)) {
    config.attention_scale = 1.0f / std::sqrt(static_cast<float>(config.embedding / config.heads));
  }
  if (gemma2) {
    config.attention_softcap = 50.0f;
    config.final_softcap = 30.0f;
    config.sliding_window = 4096;
    if (auto s =
            ReadOptionalPositive(file, p + "attn_logit_softcapping", &config.attention_softcap);
        !s.ok()) {
      return s;
    }
    // Both layer kinds rotate alike unless the file says otherwise.
    config.rope_base_sliding = config.rope_base;
    config.rope_scale_sliding = config.rope_scale;
  }
  if (auto s = ReadOptionalPositive(file, p + "final_logit_softcapping", &config.final_softcap);
      !s.ok()) {
    return s;
  }
  if (auto s = ReadOptionalInt(file, p + "attention.sliding_window", &config.sliding_window);
      !s.ok()) {
    return s;
  }
  if (config.sliding_window > 0) {
    if (auto s = ReadSlidingLayers(file, p, gemma2 ? 2 : 6, config); !s.ok()) return s;
  }
  return ReadOptionalPositive(file, p + "rope.freq_base_swa", &config.rope_base_sliding);
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
  } else if (config.architecture == "gemma2" || config.architecture == "gemma3" ||
             config.architecture == "qwen3moe" || config.architecture == "olmoe") {
    config.rope_neox = true;  // the rest is read below (ReadGemmaConfig, ReadMoeConfig)
  } else {
    return absl::UnimplementedError(StrCat("model architecture '", config.architecture,
                                           "' is not supported (supported: llama, qwen2, qwen3, "
                                           "qwen3moe, olmoe, phi3, gemma2, gemma3)"));
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
  if (file.Has(p + "rope.scaling.type")) {
    absl::StatusOr<std::string_view> type = file.GetString(p + "rope.scaling.type");
    if (!type.ok()) return type.status();
    if (*type == "linear") {
      if (auto s = ReadOptionalPositive(file, p + "rope.scaling.factor", &config.rope_scale);
          !s.ok()) {
        return s;
      }
    }
  }
  config.attention_scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  if (config.architecture.starts_with("gemma")) {
    if (absl::Status s = ReadGemmaConfig(file, p, config); !s.ok()) return s;
  }
  if (config.architecture == "qwen3moe" || config.architecture == "olmoe") {
    if (absl::Status s = ReadMoeConfig(file, p, config); !s.ok()) return s;
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
