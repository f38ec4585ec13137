#include "engine/tokenizer/incremental_detokenizer.h"

#include "engine/tokenizer/unicode.h"

namespace tandem::tokenizer {

std::string SanitizeUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (const CodePoint& cp : DecodeUtf8(bytes)) {
    if (cp.value == 0xFFFD && cp.length == 1) {
      AppendUtf8(0xFFFD, &out);
    } else {
      out.append(bytes.substr(cp.offset, cp.length));
    }
  }
  return out;
}

std::string IncrementalDetokenizer::Push(TokenId id) {
  if (id < 0 || id >= tokenizer_->vocab_size() || tokenizer_->Kind(id) == TokenKind::kControl) {
    return {};
  }
  pending_ += tokenizer_->TokenBytes(id);
  const size_t complete = CompleteUtf8Prefix(pending_);
  std::string out = SanitizeUtf8(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out = SanitizeUtf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace tandem::tokenizer
