#include "engine/tokenizer/wordpiece.h"

#include "engine/tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

// The CJK ideograph blocks BERT gives a word each (as Hugging Face's code
// has them, 0x2B920 included).
bool IsCjkIdeograph(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

bool IsAsciiSymbol(char32_t cp) {
  switch (cp) {
    case U'$':
    case U'+':
    case U'<':
    case U'=':
    case U'>':
    case U'^':
    case U'`':
    case U'|':
    case U'~':
      return true;
    default:
      return false;
  }
}

}  // namespace

std::vector<std::string> BertWords(std::string_view text, const BertNormalizer& normalizer) {
  std::vector<char32_t> cps;
  for (const CodePoint& cp : DecodeUtf8(text)) {
    if (normalizer.strip_accents) {
      AppendDecomposition(cp.value, &cps);
    } else {
      cps.push_back(cp.value);
    }
  }
  std::vector<std::string> words(1);
  auto end_word = [&words] {
    if (!words.back().empty()) words.emplace_back();
  };
  for (char32_t cp : cps) {
    if (Classify(cp) == CharClass::kWhitespace) {
      end_word();
      continue;
    }
    if (cp == 0 || cp == 0xFFFD || IsControl(cp)) continue;
    if (normalizer.strip_accents && IsMark(cp)) continue;
    const char32_t c = normalizer.lowercase ? Lowercase(cp) : cp;
    if (IsPunctuation(cp) || IsAsciiSymbol(cp) || IsCjkIdeograph(cp)) {
      end_word();
      AppendUtf8(c, &words.back());
      words.emplace_back();
    } else {
      AppendUtf8(c, &words.back());
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

}  // namespace tandem::tokenizer
