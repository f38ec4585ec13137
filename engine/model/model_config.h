// The hyper-parameters of a Llama-family model, read from GGUF metadata.
#ifndef TANDEM_ENGINE_MODEL_MODEL_CONFIG_H_
#define TANDEM_ENGINE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/gguf_file.h"

namespace tandem::model {

struct ModelConfig {
  std::string architecture;  // "llama", "qwen2", "qwen3" or "phi3"
  std::string name;          // general.name, or the file's base name
  int layers = 0;
  int embedding = 0;  // model width
  int ffn = 0;        // feed-forward width
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int vocab = 0;
  int context_length = 0;
  int rotary_dims = 0;
  float rope_base = 10000.0f;
  // Llama GGUFs store Q/K rows permuted so that rotary pairs are adjacent
  // dimensions (2i, 2i+1); Qwen2 GGUFs keep the Hugging Face layout, where
  // pairs are (i, i + rotary_dims/2) ("NeoX" style).
  bool rope_neox = false;
  // Qwen3: each head of Q and K is RMS-normed (attn_q_norm, attn_k_norm, one
  // weight of head_dim shared by the heads) after the projection, before RoPE.
  bool qk_norm = false;
  float norm_eps = 1e-5f;
};

// Values that replace what the file says (like llama.cpp's --rope-freq-base),
// for models whose metadata is wrong, and for tests that show a wrong value
// is caught.
struct ModelOverrides {
  std::optional<float> rope_base;
  std::optional<float> norm_eps;
  std::optional<bool> rope_neox;
  std::optional<int> context_length;
};

// Reads and checks the configuration. Errors name the missing or bad key.
absl::StatusOr<ModelConfig> ReadModelConfig(const GgufFile& file,
                                            const ModelOverrides& overrides = {});

}  // namespace tandem::model

#endif  // TANDEM_ENGINE_MODEL_MODEL_CONFIG_H_
