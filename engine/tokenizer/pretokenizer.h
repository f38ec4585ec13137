// Splits text into the pieces that byte-level BPE encodes independently,
// reproducing the regular expressions of the common pre-tokenizer families
// with hand-written matchers (no regex engine; linear time).
//
// A family is a sequence of split rules, applied as Hugging Face's `Sequence`
// of `Split` pre-tokenizers and llama.cpp apply theirs: each rule splits every
// piece the rules before it made, keeping both its matches and the text
// between them as pieces. Within a piece, the piece's end is the end of text
// for anchors and look-ahead.
#ifndef TANDEM_ENGINE_TOKENIZER_PRETOKENIZER_H_
#define TANDEM_ENGINE_TOKENIZER_PRETOKENIZER_H_

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::tokenizer {

enum class PretokenizerKind {
  // GPT-2, MPT: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // SmolLM, StarCoder, Refact, Command-R: \p{N} isolated first, then GPT-2.
  kDigitsThenGpt2,
  // Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  //          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // Qwen2: as Llama 3 with single digits (\p{N} instead of \p{N}{1,3}).
  kQwen2,
  // Qwen3.5: as Qwen2 with marks joining letters ([\p{L}\p{M}]+, and
  // [^\s\p{L}\p{M}\p{N}]+ for the other run).
  kQwen35,
  // Falcon: [\p{P}$+<=>^~|`]+, then GPT-2 (no trailing \s+), then [0-9]{3}.
  kFalcon,
  // DeepSeek LLM: [\r\n], \s?[Latin/Greek/Cyrillic/... letters]+,
  // \s?[ASCII and full-width punctuation]+, \s+$, [CJK/Hangul]+, \p{N}+.
  kDeepseekLlm,
  // DeepSeek Coder: [\r\n], \s?\p{L}+, \s?\p{P}+, [CJK/Hangul]+, \p{N}.
  kDeepseekCoder,
};

// Maps the GGUF `tokenizer.ggml.pre` name to a kind; unknown names are errors.
absl::StatusOr<PretokenizerKind> PretokenizerFromGgufName(std::string_view name);

// Returns the pieces of `text` in order; they concatenate to `text`.
std::vector<std::string_view> Pretokenize(PretokenizerKind kind, std::string_view text);

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_PRETOKENIZER_H_
