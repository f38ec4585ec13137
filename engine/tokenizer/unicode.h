// UTF-8 decoding and the Unicode character classes the pre-tokenizers use.
#ifndef TANDEM_ENGINE_TOKENIZER_UNICODE_H_
#define TANDEM_ENGINE_TOKENIZER_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tokenizer {

enum class CharClass : uint8_t { kLetter, kNumber, kWhitespace, kOther };

// \p{L}, \p{N}, \s (the Unicode White_Space property), or none of them.
CharClass Classify(char32_t cp);
// \p{P} (punctuation) and \p{M} (marks): the general categories P* and M*.
bool IsPunctuation(char32_t cp);
bool IsMark(char32_t cp);
// \p{C}: control, format, private-use, surrogate and unassigned code points.
bool IsControl(char32_t cp);

// The simple lowercase of cp (cp itself when it has none of its own).
char32_t Lowercase(char32_t cp);
// Appends cp's canonical decomposition (NFD of the one code point; cp itself
// when it has none). Hangul syllables decompose into their jamo.
void AppendDecomposition(char32_t cp, std::vector<char32_t>* out);

// One decoded code point and the bytes it came from.
struct CodePoint {
  char32_t value;
  uint32_t offset;  // byte offset in the text
  uint32_t length;  // bytes (1..4)
};

// Decodes UTF-8. An invalid or truncated sequence becomes one code point
// U+FFFD per offending byte, so that every input byte belongs to exactly one
// code point and the bytes reassemble the input.
std::vector<CodePoint> DecodeUtf8(std::string_view text);

// Appends the UTF-8 encoding of cp.
void AppendUtf8(char32_t cp, std::string* out);

// Length of the longest prefix of `bytes` that is complete, valid UTF-8
// except for a trailing sequence that is valid so far but unfinished, which is
// excluded. Invalid bytes count as complete (they will be replaced).
size_t CompleteUtf8Prefix(std::string_view bytes);

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_UNICODE_H_
