#include "engine/tokenizer/unicode.h"

#include <algorithm>
#include <iterator>

namespace tandem::tokenizer {
namespace {

struct CodepointRange {
  char32_t first;
  char32_t last;
};

struct CodepointPair {
  char32_t from;
  char32_t to;
};

struct CodepointDecomposition {
  char32_t from;
  char32_t to[4];  // zero-padded
};

#include "engine/tokenizer/unicode_mappings.inc"
#include "engine/tokenizer/unicode_ranges.inc"

template <size_t N>
bool InRanges(const CodepointRange (&ranges)[N], char32_t cp) {
  const CodepointRange* it = std::upper_bound(
      ranges, ranges + N, cp, [](char32_t v, const CodepointRange& r) { return v < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

bool IsWhiteSpace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

// Expected length of a sequence from its lead byte; 0 when it cannot lead.
int SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether byte `b` may follow at index i (1-based) of a sequence led by `lead`
// (rejects overlong forms, surrogates and code points above U+10FFFF).
bool ValidContinuation(unsigned char lead, int i, unsigned char b) {
  if ((b & 0xC0) != 0x80) return false;
  if (i != 1) return true;
  if (lead == 0xE0) return b >= 0xA0;
  if (lead == 0xED) return b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90;
  if (lead == 0xF4) return b <= 0x8F;
  return true;
}

}  // namespace

bool IsPunctuation(char32_t cp) { return InRanges(kPunctuationRanges, cp); }

bool IsMark(char32_t cp) { return InRanges(kMarkRanges, cp); }

bool IsControl(char32_t cp) { return InRanges(kControlRanges, cp); }

char32_t Lowercase(char32_t cp) {
  if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
  const CodepointPair* end = std::end(kLowercase);
  const CodepointPair* it =
      std::lower_bound(std::begin(kLowercase), end, cp,
                       [](const CodepointPair& p, char32_t v) { return p.from < v; });
  return it != end && it->from == cp ? it->to : cp;
}

void AppendDecomposition(char32_t cp, std::vector<char32_t>* out) {
  // Hangul syllables: leading consonant, vowel and optional trailing consonant.
  constexpr char32_t kSyllables = 0xAC00, kLeads = 0x1100, kVowels = 0x1161, kTrails = 0x11A7;
  constexpr char32_t kVowelCount = 21, kTrailCount = 28, kSyllableCount = 19 * 21 * 28;
  if (cp >= kSyllables && cp < kSyllables + kSyllableCount) {
    const char32_t s = cp - kSyllables;
    out->push_back(kLeads + s / (kVowelCount * kTrailCount));
    out->push_back(kVowels + (s % (kVowelCount * kTrailCount)) / kTrailCount);
    if (s % kTrailCount != 0) out->push_back(kTrails + s % kTrailCount);
    return;
  }
  const CodepointDecomposition* end = std::end(kDecompositions);
  const CodepointDecomposition* it =
      std::lower_bound(std::begin(kDecompositions), end, cp,
                       [](const CodepointDecomposition& d, char32_t v) { return d.from < v; });
  if (it == end || it->from != cp) {
    out->push_back(cp);
    return;
  }
  for (char32_t part : it->to) {
    if (part != 0) out->push_back(part);
  }
}

CharClass Classify(char32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    if (IsWhiteSpace(cp)) return CharClass::kWhitespace;
    return CharClass::kOther;
  }
  if (IsWhiteSpace(cp)) return CharClass::kWhitespace;
  if (InRanges(kLetterRanges, cp)) return CharClass::kLetter;
  if (InRanges(kNumberRanges, cp)) return CharClass::kNumber;
  return CharClass::kOther;
}

std::vector<CodePoint> DecodeUtf8(std::string_view text) {
  std::vector<CodePoint> out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const int length = SequenceLength(lead);
    bool valid = length > 0 && i + static_cast<size_t>(length) <= text.size();
    for (int k = 1; valid && k < length; ++k) {
      valid = ValidContinuation(lead, k, static_cast<unsigned char>(text[i + k]));
    }
    if (!valid) {
      out.push_back({0xFFFD, static_cast<uint32_t>(i), 1});
      ++i;
      continue;
    }
    char32_t cp = length == 1 ? lead : lead & (0xFF >> (length + 1));
    for (int k = 1; k < length; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    out.push_back({cp, static_cast<uint32_t>(i), static_cast<uint32_t>(length)});
    i += static_cast<size_t>(length);
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t CompleteUtf8Prefix(std::string_view bytes) {
  // Only the last (up to 3) bytes can start an unfinished sequence.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t start = n - back;
    const auto lead = static_cast<unsigned char>(bytes[start]);
    if ((lead & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const int length = SequenceLength(lead);
    if (length <= 1 || static_cast<size_t>(length) <= back) return n;
    for (size_t k = 1; k < back; ++k) {
      if (!ValidContinuation(lead, static_cast<int>(k),
                             static_cast<unsigned char>(bytes[start + k]))) {
        return n;  // already invalid: nothing to wait for
      }
    }
    return start;
  }
  return n;
}

}  // namespace tandem::tokenizer
