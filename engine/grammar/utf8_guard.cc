#include "engine/grammar/utf8_guard.h"

namespace tandem::grammar {

bool Utf8Position::Advance(std::string_view bytes) {
  for (const char c : bytes) {
    const auto byte = static_cast<uint8_t>(c);
    if (needed > 0) {
      if (byte < low || byte > high) return false;
      --needed;
      low = 0x80;
      high = 0xBF;
      continue;
    }
    if (byte < 0x80) continue;
    // A lead byte: the length of its character and the range of the byte
    // after it (narrower after E0, ED, F0 and F4; RFC 3629, section 4).
    if (byte >= 0xC2 && byte <= 0xDF) {
      needed = 1;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      needed = 2;
      if (byte == 0xE0) low = 0xA0;
      if (byte == 0xED) high = 0x9F;
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      needed = 3;
      if (byte == 0xF0) low = 0x90;
      if (byte == 0xF4) high = 0x8F;
    } else {
      return false;  // a continuation byte without a lead, C0, C1, F5-FF
    }
  }
  return true;
}

Utf8Vocabulary::Utf8Vocabulary(const tokenizer::BpeTokenizer& tokenizer)
    : bytes_(static_cast<size_t>(tokenizer.vocab_size())),
      between_characters_((static_cast<size_t>(tokenizer.vocab_size()) + 31) / 32, 0) {
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.Kind(id) != tokenizer::TokenKind::kControl) {
      bytes_[static_cast<size_t>(id)] = tokenizer.TokenBytes(id);
    }
    const std::string_view bytes = bytes_[static_cast<size_t>(id)];
    if (!bytes.empty() && (static_cast<uint8_t>(bytes[0]) & 0xC0) == 0x80) {
      continuing_.push_back(id);
      continue;
    }
    Utf8Position start;
    if (start.Advance(bytes)) between_characters_[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  }
}

void Utf8Vocabulary::Narrow(const Utf8Position& at, std::span<uint32_t> mask) const {
  if (at.between_characters()) {
    for (size_t w = 0; w < mask.size() && w < between_characters_.size(); ++w) {
      mask[w] &= between_characters_[w];
    }
    return;
  }
  std::vector<uint32_t> allowed(mask.size(), 0);
  for (const int32_t id : continuing_) {
    Utf8Position next = at;
    if (next.Advance(bytes_[static_cast<size_t>(id)])) {
      allowed[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
    }
  }
  for (size_t w = 0; w < mask.size(); ++w) mask[w] &= allowed[w];
}

bool Utf8Vocabulary::Advance(Utf8Position* at, int32_t token) const {
  if (token < 0 || static_cast<size_t>(token) >= bytes_.size()) return false;
  const std::string_view bytes = bytes_[static_cast<size_t>(token)];
  if (bytes.empty()) return at->between_characters();  // a control token
  Utf8Position next = *at;
  if (!next.Advance(bytes)) return false;
  *at = next;
  return true;
}

}  // namespace tandem::grammar
