// GPT-2's reversible map from bytes to printable code points, which
// byte-level BPE vocabularies spell their tokens in: printable Latin-1 bytes
// map to themselves, the other 68 to U+0100.. in byte order.
#ifndef TANDEM_ENGINE_TOKENIZER_BYTE_MAP_H_
#define TANDEM_ENGINE_TOKENIZER_BYTE_MAP_H_

#include <array>

namespace tandem::tokenizer {

inline std::array<char32_t, 256> ByteToCodePoint() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    map[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_BYTE_MAP_H_
