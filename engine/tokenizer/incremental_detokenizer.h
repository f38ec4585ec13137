// Turns a stream of generated tokens into a stream of text that is always
// valid UTF-8: bytes of a character split across tokens are held back until
// the character is complete; bytes that can never form a valid character are
// emitted as U+FFFD. Control tokens (e.g. <|im_end|>) produce no text.
//
// Thread safety: one instance per request, used by one thread at a time.
#ifndef TANDEM_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
#define TANDEM_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_

#include <string>

#include "engine/tokenizer/bpe_tokenizer.h"

namespace tandem::tokenizer {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const BpeTokenizer& tokenizer) : tokenizer_(&tokenizer) {}

  // Adds one token and returns the text that became complete (maybe empty).
  std::string Push(TokenId id);
  // Returns whatever is still held back (an unfinished character becomes
  // U+FFFD). Call once at the end of the stream.
  std::string Flush();

 private:
  const BpeTokenizer* tokenizer_;
  std::string pending_;
};

// `bytes` with every invalid UTF-8 byte replaced by U+FFFD.
std::string SanitizeUtf8(std::string_view bytes);

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
