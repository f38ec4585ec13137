#include "engine/tokenizer/pretokenizer.h"

#include <algorithm>
#include <span>
#include <utility>

#include "absl/status/status.h"
#include "common/strings.h"
#include "engine/tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

struct Range {
  char32_t first;
  char32_t last;
};

bool InSortedRanges(std::span<const Range> ranges, char32_t cp) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                             [](char32_t v, const Range& r) { return v < r.first; });
  return it != ranges.begin() && cp <= (it - 1)->last;
}

// The character classes DeepSeek's tokenizers spell out in their regular
// expressions (tokenizer.json), sorted. Letters: Latin, Greek, Cyrillic,
// Armenian, Georgian, Cherokee and other cased scripts.
constexpr Range kDeepseekLetters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},
    {0xD8, 0xF6},       {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},
    {0x295, 0x2AF},     {0x370, 0x373},     {0x376, 0x377},     {0x37B, 0x37D},
    {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},     {0x38C, 0x38C},
    {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
// ASCII punctuation and symbols, curly quotes, ideographic space and full stops,
// full-width punctuation.
constexpr Range kDeepseekPunctuation[] = {{0x21, 0x2F},     {0x3A, 0x7E},     {0x2018, 0x201F},
                                          {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}};
// [一-龥ࠀ-一가-퟿]: U+0800..U+9FA5 and Hangul syllables through U+D7FF.
constexpr Range kCjkHangul[] = {{0x800, 0x9FA5}, {0xAC00, 0xD7FF}};

// One split rule: a regular expression of some family, as a matcher.
enum class Rule {
  kGpt2,                 // the GPT-2 expression (its last `|\s+` makes no difference to pieces)
  kLlama3,               // the Llama 3 expression
  kLlama3OneDigit,       // the Qwen2 expression
  kNumber,               // \p{N}
  kNumbers,              // \p{N}+
  kNewline,              // [\r\n]
  kLetters,              // \s?\p{L}+
  kPunctuation,          // \s?\p{P}+
  kFalconPunctuation,    // [\p{P}$+<=>^~|`]+
  kThreeAsciiDigits,     // [0-9][0-9][0-9]
  kDeepseekLetters,      // \s?[kDeepseekLetters]+
  kDeepseekPunctuation,  // \s?[kDeepseekPunctuation]+
  kTrailingWhitespace,   // \s+$
  kCjkHangul,            // [kCjkHangul]+
};

std::span<const Rule> RulesOf(PretokenizerKind kind) {
  static constexpr Rule kGpt2[] = {Rule::kGpt2};
  static constexpr Rule kDigitsThenGpt2[] = {Rule::kNumber, Rule::kGpt2};
  static constexpr Rule kLlama3[] = {Rule::kLlama3};
  static constexpr Rule kQwen2[] = {Rule::kLlama3OneDigit};
  static constexpr Rule kFalcon[] = {Rule::kFalconPunctuation, Rule::kGpt2,
                                     Rule::kThreeAsciiDigits};
  static constexpr Rule kDeepseekLlm[] = {Rule::kNewline,
                                          Rule::kDeepseekLetters,
                                          Rule::kDeepseekPunctuation,
                                          Rule::kTrailingWhitespace,
                                          Rule::kCjkHangul,
                                          Rule::kNumbers};
  static constexpr Rule kDeepseekCoder[] = {Rule::kNewline, Rule::kLetters, Rule::kPunctuation,
                                            Rule::kCjkHangul, Rule::kNumber};
  switch (kind) {
    case PretokenizerKind::kGpt2:
      return kGpt2;
    case PretokenizerKind::kDigitsThenGpt2:
      return kDigitsThenGpt2;
    case PretokenizerKind::kLlama3:
      return kLlama3;
    case PretokenizerKind::kQwen2:
    case PretokenizerKind::kQwen35:
      return kQwen2;
    case PretokenizerKind::kFalcon:
      return kFalcon;
    case PretokenizerKind::kDeepseekLlm:
      return kDeepseekLlm;
    case PretokenizerKind::kDeepseekCoder:
      return kDeepseekCoder;
  }
  return kGpt2;
}

// Matches rules at code point positions of one text. Each match is confined
// to the piece being split: Limit() sets it, and anchors ($) and look-ahead
// ((?!\S)) see its end as the end of text.
class Matcher {
 public:
  Matcher(const std::vector<CodePoint>& cps, bool marks_are_letters)
      : cps_(cps), classes_(cps.size()), end_(cps.size()), trailing_whitespace_(cps.size()) {
    for (size_t i = 0; i < cps.size(); ++i) {
      classes_[i] = Classify(cps[i].value);
      if (marks_are_letters && classes_[i] == CharClass::kOther && IsMark(cps[i].value)) {
        classes_[i] = CharClass::kLetter;
      }
    }
  }

  // Confines matches to the piece [begin, end).
  void Limit(size_t begin, size_t end) {
    end_ = end;
    trailing_whitespace_ = end;
    while (trailing_whitespace_ > begin &&
           classes_[trailing_whitespace_ - 1] == CharClass::kWhitespace) {
      --trailing_whitespace_;
    }
  }

  // Length in code points of the rule's match starting at i, or 0.
  size_t Match(Rule rule, size_t i) const {
    switch (rule) {
      case Rule::kGpt2:
        return Gpt2(i);
      case Rule::kLlama3:
        return Llama3(i, 3);
      case Rule::kLlama3OneDigit:
        return Llama3(i, 1);
      case Rule::kNumber:
        return ClassAt(i) == CharClass::kNumber ? 1 : 0;
      case Rule::kNumbers:
        return RunOf(i, CharClass::kNumber) - i;
      case Rule::kNewline:
        return IsNewline(i) ? 1 : 0;
      case Rule::kLetters:
        return SpaceThenRun(i, [this](size_t j) { return ClassAt(j) == CharClass::kLetter; });
      case Rule::kPunctuation:
        return SpaceThenRun(i, [this](size_t j) { return IsPunctuation(cps_[j].value); });
      case Rule::kFalconPunctuation:
        return RunWhile(i,
                        [this](size_t j) {
                          const char32_t c = cps_[j].value;
                          return IsPunctuation(c) || c == U'$' || c == U'+' || c == U'<' ||
                                 c == U'=' || c == U'>' || c == U'^' || c == U'~' || c == U'|' ||
                                 c == U'`';
                        }) -
               i;
      case Rule::kThreeAsciiDigits: {
        auto digit = [this](size_t j) {
          return j < end_ && cps_[j].value >= U'0' && cps_[j].value <= U'9';
        };
        return digit(i) && digit(i + 1) && digit(i + 2) ? 3 : 0;
      }
      case Rule::kDeepseekLetters:
        return SpaceThenRun(
            i, [this](size_t j) { return InSortedRanges(kDeepseekLetters, cps_[j].value); });
      case Rule::kDeepseekPunctuation:
        return SpaceThenRun(
            i, [this](size_t j) { return InSortedRanges(kDeepseekPunctuation, cps_[j].value); });
      case Rule::kTrailingWhitespace:
        return i >= trailing_whitespace_ ? end_ - i : 0;
      case Rule::kCjkHangul:
        return RunWhile(i, [this](size_t j) { return InSortedRanges(kCjkHangul, cps_[j].value); }) -
               i;
    }
    return 0;
  }

 private:
  size_t Gpt2(size_t i) const {
    if (size_t n = Contraction(i, /*ignore_case=*/false)) return n;
    const size_t after_space = Is(i, U' ') ? i + 1 : i;
    for (CharClass c : {CharClass::kLetter, CharClass::kNumber, CharClass::kOther}) {
      if (ClassAt(after_space) == c) return RunOf(after_space, c) - i;
      if (ClassAt(i) == c) return RunOf(i, c) - i;
    }
    return Whitespace(i);
  }

  size_t Llama3(size_t i, size_t max_digits) const {
    if (size_t n = Contraction(i, /*ignore_case=*/true)) return n;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (ClassAt(i) == CharClass::kLetter) return RunOf(i, CharClass::kLetter) - i;
    if (!IsNewline(i) && ClassAt(i) != CharClass::kNumber && ClassAt(i + 1) == CharClass::kLetter) {
      return RunOf(i + 1, CharClass::kLetter) - i;
    }
    // \p{N}{1,max}
    if (ClassAt(i) == CharClass::kNumber) {
      size_t j = i;
      while (j < end_ && j - i < max_digits && classes_[j] == CharClass::kNumber) ++j;
      return j - i;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    const size_t after_space = Is(i, U' ') ? i + 1 : i;
    for (size_t start : {after_space, i}) {
      if (ClassAt(start) == CharClass::kOther) {
        size_t j = RunOf(start, CharClass::kOther);
        while (IsNewline(j)) ++j;
        return j - i;
      }
    }
    // \s*[\r\n]+ : through the last newline of the whitespace run.
    const size_t end = RunOf(i, CharClass::kWhitespace);
    for (size_t j = end; j > i; --j) {
      if (IsNewline(j - 1)) return j - i;
    }
    return Whitespace(i);
  }

  CharClass ClassAt(size_t i) const {
    return i < end_ ? classes_[i] : CharClass::kWhitespace;  // never matched past the end
  }
  bool Is(size_t i, char32_t c) const { return i < end_ && cps_[i].value == c; }
  bool IsNewline(size_t i) const { return Is(i, U'\r') || Is(i, U'\n'); }
  size_t RunOf(size_t i, CharClass c) const {
    while (i < end_ && classes_[i] == c) ++i;
    return i;
  }
  template <typename Pred>
  size_t RunWhile(size_t i, Pred in_class) const {
    while (i < end_ && in_class(i)) ++i;
    return i;
  }
  // \s?[class]+
  template <typename Pred>
  size_t SpaceThenRun(size_t i, Pred in_class) const {
    if (i < end_ && in_class(i)) return RunWhile(i, in_class) - i;
    if (ClassAt(i) == CharClass::kWhitespace && i + 1 < end_ && in_class(i + 1)) {
      return RunWhile(i + 1, in_class) - i;
    }
    return 0;
  }

  // 's 't 're 've 'm 'll 'd
  size_t Contraction(size_t i, bool ignore_case) const {
    if (!Is(i, U'\'')) return 0;
    auto lower = [&](size_t j) -> char32_t {
      if (j >= end_) return 0;
      const char32_t c = cps_[j].value;
      return ignore_case && c >= U'A' && c <= U'Z' ? c + 32 : c;
    };
    const char32_t a = lower(i + 1), b = lower(i + 2);
    if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
    if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
    return 0;
  }

  // \s+(?!\S)|\s+ : a whitespace run, leaving its last character to the next
  // piece when a non-space follows and the run is longer than one.
  size_t Whitespace(size_t i) const {
    const size_t end = RunOf(i, CharClass::kWhitespace);
    if (end == i) return 1;  // unreachable for well-formed classes; always progress
    if (end == end_ || end - i == 1) return end - i;
    return end - 1 - i;
  }

  const std::vector<CodePoint>& cps_;
  std::vector<CharClass> classes_;
  size_t end_;
  size_t trailing_whitespace_;  // where the whitespace run that ends at end_ begins
};

}  // namespace

absl::StatusOr<PretokenizerKind> PretokenizerFromGgufName(std::string_view name) {
  if (name == "default" || name == "gpt2" || name == "gpt-2" || name == "mpt" || name == "olmo" ||
      name == "phi-2") {
    return PretokenizerKind::kGpt2;
  }
  if (name == "smollm" || name == "starcoder" || name == "refact" || name == "codeshell" ||
      name == "command-r") {
    return PretokenizerKind::kDigitsThenGpt2;
  }
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3" || name == "smaug-bpe" ||
      name == "dbrx") {
    return PretokenizerKind::kLlama3;
  }
  if (name == "qwen2" || name == "deepseek-r1-qwen" || name == "stablelm2") {
    return PretokenizerKind::kQwen2;
  }
  if (name == "qwen35") return PretokenizerKind::kQwen35;
  if (name == "falcon") return PretokenizerKind::kFalcon;
  if (name == "deepseek-llm") return PretokenizerKind::kDeepseekLlm;
  if (name == "deepseek-coder") return PretokenizerKind::kDeepseekCoder;
  return absl::UnimplementedError(
      StrCat("pre-tokenizer '", name,
             "' is not supported (supported: gpt2, mpt, olmo, smollm, starcoder, refact, "
             "command-r, llama-bpe, qwen2, qwen35, falcon, deepseek-llm, deepseek-coder)"));
}

std::vector<std::string_view> Pretokenize(PretokenizerKind kind, std::string_view text) {
  const std::vector<CodePoint> cps = DecodeUtf8(text);
  Matcher matcher(cps, /*marks_are_letters=*/kind == PretokenizerKind::kQwen35);
  // Pieces as [begin, end) code point indices.
  std::vector<std::pair<size_t, size_t>> pieces = {{0, cps.size()}};
  std::vector<std::pair<size_t, size_t>> split;
  for (Rule rule : RulesOf(kind)) {
    split.clear();
    for (auto [begin, end] : pieces) {
      matcher.Limit(begin, end);
      size_t unmatched = begin;  // start of the text no match has taken yet
      size_t i = begin;
      while (i < end) {
        const size_t n = matcher.Match(rule, i);
        if (n == 0) {
          ++i;
          continue;
        }
        if (unmatched < i) split.emplace_back(unmatched, i);
        split.emplace_back(i, i + n);
        i += n;
        unmatched = i;
      }
      if (unmatched < end) split.emplace_back(unmatched, end);
    }
    std::swap(pieces, split);
  }
  std::vector<std::string_view> out;
  out.reserve(pieces.size());
  for (auto [begin, end] : pieces) {
    if (begin == end) continue;
    const size_t from = cps[begin].offset;
    const size_t to = end < cps.size() ? cps[end].offset : text.size();
    out.push_back(text.substr(from, to - from));
  }
  return out;
}

}  // namespace tandem::tokenizer
