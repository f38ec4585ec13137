// The whole-file types a model can be written in (tandem-bench --write_gguf
// --type=...), and which tensor type each tensor gets in one: llama.cpp's
// llama-quantize rules for the named mixture, so that a file written here has
// the tensor types llama-quantize would give the same model.
//
// The rules, for the shapes --model=random: knows (no 8-expert mixtures, no
// 70B, no Falcon, which llama-quantize treats apart):
// - vectors (norms, biases) and a mixture's router stay F32;
// - the output projection, or the token embedding where it doubles as one,
//   is Q6_K (Q8_0 in a Q8_0 file);
// - in Q4_K_M and Q5_K_M, attn_v (or a fused attn_qkv) and ffn_down are Q6_K
//   in "more bits" layers: the first and last eighth, and every third layer
//   between (UseMoreBits);
// - in IQ4_XS, attn_v (or attn_qkv) is Q5_K where four or more query heads
//   share a KV head, and ffn_down is Q5_K in the first eighth of the layers;
// - everything else is the mixture's base type: Q4_K, Q5_K, Q6_K, Q8_0 or
//   IQ4_XS;
// - a row whose length is not a multiple of the chosen type's block falls
//   back: Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, IQ4_XS to IQ4_NL, and to
//   F16 where even that does not divide it.
#ifndef TANDEM_ENGINE_MODEL_FILE_TYPE_H_
#define TANDEM_ENGINE_MODEL_FILE_TYPE_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/kernels/dtype.h"

namespace tandem::model {

enum class FileType { kF32, kF16, kBF16, kQ8_0, kQ6_K, kQ5_K_M, kQ4_K_M, kIQ4_XS };

// "F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS" (any case);
// INVALID_ARGUMENT naming the known ones otherwise.
absl::StatusOr<FileType> ParseFileType(std::string_view name);
std::string_view FileTypeName(FileType type);
// The value of general.file_type (llama.cpp's llama_ftype numbering).
uint32_t LlamaFileTypeId(FileType type);

// Where a tensor sits in the model, for TensorTypeFor.
struct TensorPlace {
  std::string_view name;            // "blk.3.attn_v.weight"
  int rank = 2;                     // 1 for vectors
  int64_t row_length = 0;           // dims[0]
  int layer = -1;                   // the block's index; -1 outside the blocks
  int layers = 0;                   // blocks in the model
  bool tied_embeddings = false;     // token_embd is also the output projection
  int query_heads_per_kv_head = 1;  // heads / kv_heads
};

// Whether layer i of n gets the bigger type in a _M mixture.
bool UseMoreBits(int layer, int layers);

// The tensor type `place` gets in a file of `type`.
kernels::DType TensorTypeFor(FileType type, const TensorPlace& place);

}  // namespace tandem::model

#endif  // TANDEM_ENGINE_MODEL_FILE_TYPE_H_
