// Splits text into the pieces that byte-level BPE encodes independently,
// reproducing the regular expressions of the common pre-tokenizer families
// with hand-written matchers (no regex engine; linear time).
#ifndef TANDEM_ENGINE_TOKENIZER_PRETOKENIZER_H_
#define TANDEM_ENGINE_TOKENIZER_PRETOKENIZER_H_

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::tokenizer {

enum class PretokenizerKind {
  // GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // SmolLM / StarCoder: every \p{N} is isolated first, then GPT-2.
  kDigitsThenGpt2,
  // Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  //          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // Qwen2: as Llama 3 with single digits (\p{N} instead of \p{N}{1,3}).
  kQwen2,
};

// Maps the GGUF `tokenizer.ggml.pre` name to a kind; unknown names are errors.
absl::StatusOr<PretokenizerKind> PretokenizerFromGgufName(std::string_view name);

// Returns the pieces of `text` in order; they concatenate to `text`.
std::vector<std::string_view> Pretokenize(PretokenizerKind kind, std::string_view text);

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_PRETOKENIZER_H_
