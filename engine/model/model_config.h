// The hyper-parameters of a Llama-family model, read from GGUF metadata.
#ifndef TANDEM_ENGINE_MODEL_MODEL_CONFIG_H_
#define TANDEM_ENGINE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/gguf_file.h"

namespace tandem::model {

struct ModelConfig {
  // "llama", "qwen2", "qwen3", "qwen3moe", "olmoe", "phi3", "gemma2" or "gemma3"
  std::string architecture;
  std::string name;  // general.name, or the file's base name
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
  // OLMoE: Q and K are RMS-normed over their whole width (one weight of
  // heads * head_dim), not per head.
  bool qk_norm_whole = false;
  float norm_eps = 1e-5f;
  // Mixture of experts (Qwen3-MoE, OLMoE): each layer's feed-forward is
  // `experts` SwiGLU experts of width expert_ffn, of which each token goes
  // through experts_used, weighted by its router probabilities
  // (moe_routing.h: renormalised over the chosen ones for Qwen3-MoE, not for
  // OLMoE). experts == 0: one dense feed-forward of width ffn.
  int experts = 0;
  int experts_used = 0;
  int expert_ffn = 0;
  bool expert_weights_norm = false;
  float expert_weights_scale = 1.0f;
  bool IsMoe() const { return experts > 0; }
  // Linear RoPE scaling (rope.scaling.type "linear"): positions are divided
  // by this factor. Other scaling types are not applied.
  float rope_scale = 1.0f;
  // Scale of the attention scores (of q . k): 1/sqrt(head_dim), but Gemma's
  // 27B models use 1/sqrt(embedding / heads), as llama.cpp does.
  float attention_scale = 0.0f;

  // Gemma 2 and 3. The feed-forward's gate goes through GELU (tanh form)
  // rather than SiLU; token embeddings are multiplied by sqrt(embedding);
  // each sublayer's output is RMS-normed again (post_attention_norm,
  // post_ffw_norm) before the residual add.
  enum class Activation { kSilu, kGeluTanh };
  Activation activation = Activation::kSilu;
  float embedding_scale = 1.0f;
  bool post_norms = false;
  // Soft-capping (cap * tanh(x / cap); 0: none) of attention scores and of
  // the final logits (Gemma 2; Gemma 3 files may cap the logits).
  float attention_softcap = 0.0f;
  float final_softcap = 0.0f;
  // Sliding-window layers: sliding_layers[i] says whether layer i attends
  // only the last `sliding_window` positions; those layers rotate with
  // their own base and no scaling (Gemma 3: 10,000 where global layers use
  // 1,000,000 and, on the larger models, linear scaling). Empty: none.
  int sliding_window = 0;
  std::vector<bool> sliding_layers;
  float rope_base_sliding = 10000.0f;
  float rope_scale_sliding = 1.0f;
  bool HasSlidingLayers() const { return sliding_window > 0 && !sliding_layers.empty(); }
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
