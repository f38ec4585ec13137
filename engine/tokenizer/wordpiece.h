// BERT's basic tokenizer: the normalization and word splitting that come
// before WordPiece (BpeTokenizer's kWordPiece model matches the pieces).
#ifndef TANDEM_ENGINE_TOKENIZER_WORDPIECE_H_
#define TANDEM_ENGINE_TOKENIZER_WORDPIECE_H_

#include <string>
#include <string_view>
#include <vector>

namespace tandem::tokenizer {

struct BertNormalizer {
  bool lowercase = true;
  bool strip_accents = true;  // canonical decomposition, then marks dropped
};

// The words of `text` (UTF-8), in order: split at whitespace; NUL, U+FFFD
// and \p{C} characters dropped; each punctuation character (\p{P}, or an
// ASCII symbol) and each CJK ideograph a word of its own; lowercased and
// without accents as the normalizer says.
std::vector<std::string> BertWords(std::string_view text, const BertNormalizer& normalizer);

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_WORDPIECE_H_
