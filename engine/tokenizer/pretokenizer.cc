#include "engine/tokenizer/pretokenizer.h"

#include "absl/status/status.h"
#include "common/strings.h"
#include "engine/tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

// Matches one piece at a time over decoded code points.
class Matcher {
 public:
  Matcher(const std::vector<CodePoint>& cps) : cps_(cps), classes_(cps.size()) {
    for (size_t i = 0; i < cps.size(); ++i) classes_[i] = Classify(cps[i].value);
  }

  size_t size() const { return cps_.size(); }

  // Length (in code points) of the piece starting at i, for each family.
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
      while (j < cps_.size() && j - i < max_digits && classes_[j] == CharClass::kNumber) ++j;
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

 private:
  CharClass ClassAt(size_t i) const {
    return i < classes_.size() ? classes_[i] : CharClass::kWhitespace;  // never matched past end
  }
  bool Is(size_t i, char32_t c) const { return i < cps_.size() && cps_[i].value == c; }
  bool IsNewline(size_t i) const { return Is(i, U'\r') || Is(i, U'\n'); }
  size_t RunOf(size_t i, CharClass c) const {
    while (i < classes_.size() && classes_[i] == c) ++i;
    return i;
  }

  // 's 't 're 've 'm 'll 'd
  size_t Contraction(size_t i, bool ignore_case) const {
    if (!Is(i, U'\'')) return 0;
    auto lower = [&](size_t j) -> char32_t {
      if (j >= cps_.size()) return 0;
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
    if (end == cps_.size() || end - i == 1) return end - i;
    return end - 1 - i;
  }

  const std::vector<CodePoint>& cps_;
  std::vector<CharClass> classes_;
};

void Split(PretokenizerKind kind, std::string_view text, std::vector<std::string_view>* out) {
  const std::vector<CodePoint> cps = DecodeUtf8(text);
  const Matcher m(cps);
  size_t i = 0;
  while (i < m.size()) {
    size_t n = 0;
    switch (kind) {
      case PretokenizerKind::kGpt2:
      case PretokenizerKind::kDigitsThenGpt2:
        n = m.Gpt2(i);
        break;
      case PretokenizerKind::kLlama3:
        n = m.Llama3(i, 3);
        break;
      case PretokenizerKind::kQwen2:
        n = m.Llama3(i, 1);
        break;
    }
    const size_t begin = cps[i].offset;
    const size_t end = i + n < cps.size() ? cps[i + n].offset : text.size();
    out->push_back(text.substr(begin, end - begin));
    i += n;
  }
}

}  // namespace

absl::StatusOr<PretokenizerKind> PretokenizerFromGgufName(std::string_view name) {
  if (name == "default" || name == "gpt2" || name == "gpt-2") return PretokenizerKind::kGpt2;
  if (name == "smollm" || name == "starcoder" || name == "refact" || name == "codeshell") {
    return PretokenizerKind::kDigitsThenGpt2;
  }
  if (name == "llama-bpe" || name == "llama3" || name == "smaug-bpe" || name == "dbrx") {
    return PretokenizerKind::kLlama3;
  }
  if (name == "qwen2" || name == "deepseek-r1-qwen") return PretokenizerKind::kQwen2;
  return absl::UnimplementedError(
      StrCat("pre-tokenizer '", name,
             "' is not supported (supported: gpt2, smollm, starcoder, llama-bpe, qwen2)"));
}

std::vector<std::string_view> Pretokenize(PretokenizerKind kind, std::string_view text) {
  std::vector<std::string_view> out;
  if (kind != PretokenizerKind::kDigitsThenGpt2) {
    Split(kind, text, &out);
    return out;
  }
  // Isolate every number character, then split the rest with GPT-2's rules.
  const std::vector<CodePoint> cps = DecodeUtf8(text);
  size_t segment_start = 0;
  for (const CodePoint& cp : cps) {
    if (Classify(cp.value) != CharClass::kNumber) continue;
    if (cp.offset > segment_start) {
      Split(PretokenizerKind::kGpt2, text.substr(segment_start, cp.offset - segment_start), &out);
    }
    out.push_back(text.substr(cp.offset, cp.length));
    segment_start = cp.offset + cp.length;
  }
  if (segment_start < text.size()) Split(PretokenizerKind::kGpt2, text.substr(segment_start), &out);
  return out;
}

}  // namespace tandem::tokenizer
