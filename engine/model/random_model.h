// Models of real shapes with random weights, built without a file
// (--model=random:NAME): for measuring speed on shapes whose weights are
// not at hand (an 8B model on a test machine, a GPU check with no model
// hub). The weights are Q4_0 matrices (scales giving each row a spread of
// about 1/sqrt(inputs)) and unit norms, drawn from a seed; the vocabulary is
// byte-level (256 byte tokens, ChatML's special tokens, unused fillers), so
// text prompts work and come out as bytes. What it generates is noise; how
// fast it does is the point.
#ifndef TANDEM_ENGINE_MODEL_RANDOM_MODEL_H_
#define TANDEM_ENGINE_MODEL_RANDOM_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/file_type.h"
#include "engine/model/gguf_file.h"

namespace tandem::model {

struct RandomModelShape {
  std::string name;          // "llama3-8b"
  std::string architecture;  // "llama", "qwen2", "qwen3" (with Q/K norms) or "olmoe"
  int layers = 0;
  int embedding = 0;
  int ffn = 0;
  int heads = 0;
  int kv_heads = 0;
  int vocab = 0;
  int context = 0;
  float rope_theta = 10000.0f;
  float rms_epsilon = 1e-5f;
  bool qkv_bias = false;         // Qwen2's
  bool tied_embeddings = false;  // the output head is the embedding
  int head_dim = 0;              // 0: embedding / heads
  // A mixture of experts (architecture "olmoe"): `experts` feed-forward
  // blocks of width `ffn`, `experts_used` of them per token.
  int experts = 0;
  int experts_used = 0;
};

// The shapes --model=random: knows: llama3-8b, llama3.2-1b, qwen2.5-3b,
// qwen2.5-7b, qwen3-8b, olmoe-1b-7b, smollm2-135m.
const std::vector<RandomModelShape>& RandomModelShapes();

// Whether `model_flag` asks for a random model ("random:...").
bool IsRandomModel(std::string_view model_flag);

// Builds "random:NAME[@SEED]" (seed 0 by default) as a GGUF file in memory
// (a memfd) and opens it. INVALID_ARGUMENT naming the known shapes for an
// unknown name.
absl::StatusOr<std::unique_ptr<GgufFile>> OpenRandomModel(std::string_view model_flag);
// The same for a shape of the caller's (a small one, in tests).
absl::StatusOr<std::unique_ptr<GgufFile>> OpenRandomModel(const RandomModelShape& shape,
                                                          uint64_t seed);

// Writes "random:NAME[@SEED]" to the file `path` as a GGUF of `type`, for
// llama.cpp and Tandem to load the very same file: the same shape, the same
// vocabulary, but weights drawn as floats (close to normal, standard
// deviation 1/sqrt(inputs)) and quantized by QuantizeRow to the tensor types
// TensorTypeFor gives them, on `threads` threads, streamed to disk without a
// copy in memory.
absl::Status WriteRandomModel(std::string_view model_flag, FileType type, const std::string& path,
                              int threads);

// The model a --model value names: "random:..." builds one (OpenRandomModel),
// anything else is a GGUF file's path (GgufFile::Open).
absl::StatusOr<std::unique_ptr<GgufFile>> OpenModel(std::string_view model_flag);

}  // namespace tandem::model

#endif  // TANDEM_ENGINE_MODEL_RANDOM_MODEL_H_
