// Keeps structured output valid UTF-8 across token boundaries.
//
// A byte-level vocabulary has tokens that are parts of a character (a lone
// lead byte, lone continuation bytes). xgrammar 0.2.9 checks characters
// inside strings loosely: it lets a three-byte lead 0xED be followed by
// 0xA0-0xBF, which encodes a UTF-16 surrogate, and JSON parsers refuse the
// result. The guard tracks the character in progress over the accepted
// tokens and narrows each mask to the tokens that keep the bytes valid
// UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF), and ends an answer only between characters.
#ifndef TANDEM_ENGINE_GRAMMAR_UTF8_GUARD_H_
#define TANDEM_ENGINE_GRAMMAR_UTF8_GUARD_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "engine/tokenizer/bpe_tokenizer.h"

namespace tandem::grammar {

// Where a byte stream stands: how many continuation bytes the character in
// progress still needs and the range the next one must fall in.
struct Utf8Position {
  int needed = 0;
  uint8_t low = 0x80, high = 0xBF;

  bool between_characters() const { return needed == 0; }
  // Advances over `bytes`; false when they make the stream invalid.
  bool Advance(std::string_view bytes);
};

// Per vocabulary: which tokens can follow which positions.
class Utf8Vocabulary {
 public:
  // Control tokens count as ending nothing and starting nothing: allowed
  // between characters only. `tokenizer` must outlive this.
  explicit Utf8Vocabulary(const tokenizer::BpeTokenizer& tokenizer);

  // Clears from `mask` (bit id % 32 of word id / 32) every token that would
  // make the bytes invalid after `at`.
  void Narrow(const Utf8Position& at, std::span<uint32_t> mask) const;
  // `at` advanced over `token`; false when the token makes the bytes invalid.
  bool Advance(Utf8Position* at, int32_t token) const;

 private:
  std::vector<std::string_view> bytes_;  // of each token; empty for control
  // Tokens allowed between characters (ASCII, control, and those that begin
  // a character and are valid so far), as a mask.
  std::vector<uint32_t> between_characters_;
  // Tokens that begin with a continuation byte: the only ones that can
  // follow a character in progress.
  std::vector<int32_t> continuing_;
};

}  // namespace tandem::grammar

#endif  // TANDEM_ENGINE_GRAMMAR_UTF8_GUARD_H_
