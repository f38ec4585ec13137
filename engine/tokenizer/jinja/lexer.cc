#include "engine/tokenizer/jinja/lexer.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "common/strings.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/text.h"

namespace tandem::jinja {
namespace {

using internal::Error;

[[noreturn]] void FailAt(int line, std::string message) {
  throw Error(absl::StatusCode::kInvalidArgument, std::move(message), line);
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// The code point at s[i] and its length in bytes.
char32_t CodePointAt(std::string_view s, size_t i, size_t* len) {
  auto b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : 4;
  if (i + n > s.size()) n = 1;
  std::u32string cps = text::Decode(s.substr(i, n));
  if (cps.size() != 1) n = 1;
  *len = n;
  return cps.empty() ? 0xFFFD : cps[0];
}

// Length of the run of Python whitespace (\s) at s[i].
size_t WhitespaceRun(std::string_view s, size_t i) {
  size_t start = i;
  while (i < s.size()) {
    size_t len = 1;
    char32_t c = CodePointAt(s, i, &len);
    if (!text::IsSpace(c)) break;
    i += len;
  }
  return i - start;
}

// Length of text.rstrip() (Python whitespace).
size_t RStripLength(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t len = 0;
    char32_t c = CodePointAt(s, start, &len);
    if (start + len != end || !text::IsSpace(c)) break;
    end = start;
  }
  return end;
}

int CountNewlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Python's "unicode-escape" decoding of a string literal's body, after
// jinja2's backslashreplace of non-ASCII characters.
std::string Unescape(std::string_view body, int line) {
  std::string out;
  out.reserve(body.size());
  auto hex = [&](size_t at, int digits, const char* what) -> char32_t {
    if (at + digits > body.size()) FailAt(line, StrCat("truncated ", what, " escape"));
    char32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      char c = body[at + k];
      int d = IsDigit(c)               ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                       : -1;
      if (d < 0) FailAt(line, StrCat("truncated ", what, " escape"));
      v = v * 16 + d;
    }
    return v;
  };
  for (size_t i = 0; i < body.size();) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out.push_back(c);
      ++i;
      continue;
    }
    char n = body[i + 1];
    if (static_cast<unsigned char>(n) >= 0x80) {
      // "\é" became "\\xe9" before decoding: a backslash, then the escape text.
      size_t len = 0;
      char32_t cp = CodePointAt(body, i + 1, &len);
      char buf[16];
      if (cp <= 0xFF) {
        std::snprintf(buf, sizeof(buf), "x%02x", static_cast<unsigned>(cp));
      } else if (cp <= 0xFFFF) {
        std::snprintf(buf, sizeof(buf), "u%04x", static_cast<unsigned>(cp));
      } else {
        std::snprintf(buf, sizeof(buf), "U%08x", static_cast<unsigned>(cp));
      }
      out.push_back('\\');
      out.append(buf);
      i += 1 + len;
      continue;
    }
    i += 2;
    switch (n) {
      case '\n':
        break;
      case '\\':
      case '\'':
      case '"':
        out.push_back(n);
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
        text::AppendUtf8(hex(i, 2, "\\xXX"), &out);
        i += 2;
        break;
      case 'u':
        text::AppendUtf8(hex(i, 4, "\\uXXXX"), &out);
        i += 4;
        break;
      case 'U': {
        char32_t cp = hex(i, 8, "\\UXXXXXXXX");
        if (cp > 0x10FFFF) FailAt(line, "illegal Unicode character");
        text::AppendUtf8(cp, &out);
        i += 8;
        break;
      }
      case 'N':
        FailAt(line, "unsupported \\N{...} escape in a string literal");
      default:
        if (n >= '0' && n <= '7') {
          char32_t v = n - '0';
          for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k) {
            v = v * 8 + (body[i++] - '0');
          }
          text::AppendUtf8(v, &out);
        } else {
          out.push_back('\\');
          out.push_back(n);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Newlines become \n, and one trailing newline goes (keep_trailing_newline
    // is off).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> Run() {
    while (pos_ < src_.size()) {
      size_t p = FindTagStart(pos_);
      if (p == std::string::npos) {
        Emit(TokenType::kData, src_.substr(pos_));
        line_ += CountNewlines(std::string_view(src_).substr(pos_));
        pos_ = src_.size();
        break;
      }
      char kind = src_[p + 1];
      size_t after = p + 2;
      char sign =
          after < src_.size() && (src_[after] == '-' || src_[after] == '+') ? src_[after] : 0;
      size_t raw_end = kind == '%' ? MatchRawBegin(p) : 0;
      std::string_view text = std::string_view(src_).substr(pos_, p - pos_);
      int text_newlines = CountNewlines(text);
      EmitText(text, sign, kind != '{');
      line_ += text_newlines;
      if (sign != 0) ++after;
      if (raw_end != 0) {
        LexRaw(raw_end);
      } else if (kind == '#') {
        LexComment(after);
      } else {
        LexTag(after, kind == '%');
      }
    }
    tokens_.push_back(Token{TokenType::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  // `{%(-|+|)\s*raw\s*(-%}\s*|%})` at p: the end of the match, or 0.
  size_t MatchRawBegin(size_t p) const {
    size_t i = p + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    i += WhitespaceRun(src_, i);
    if (src_.compare(i, 3, "raw") != 0) return 0;
    i += 3;
    i += WhitespaceRun(src_, i);
    if (src_.compare(i, 3, "-%}") == 0) return i + 3 + WhitespaceRun(src_, i + 3);
    if (src_.compare(i, 2, "%}") == 0) return i + 2;
    return 0;
  }

  void Emit(TokenType type, std::string value) {
    tokens_.push_back(Token{type, std::move(value), line_});
  }

  // Text before a tag, with `-` stripping and lstrip_blocks applied.
  void EmitText(std::string_view text, char sign, bool block_like) {
    if (sign == '-') {
      text = text.substr(0, RStripLength(text));
    } else if (sign != '+' && block_like) {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string_view::npos ? 0 : l_pos + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size() &&
          WhitespaceRun(text, l_pos) == text.size() - l_pos) {
        text = text.substr(0, l_pos);
      }
    }
    if (!text.empty()) Emit(TokenType::kData, std::string(text));
  }

  void LexComment(size_t start) {
    size_t end = src_.find("#}", start);
    if (end == std::string::npos)
      throw Error(absl::StatusCode::kInvalidArgument, "Missing end of comment tag", line_);
    char sign = end > start && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    size_t next = end + 2;
    if (sign == '-') {
      next += WhitespaceRun(src_, next);
    } else if (sign != '+' && next < src_.size() && src_[next] == '\n') {
      ++next;  // trim_blocks
    }
    line_ += CountNewlines(std::string_view(src_).substr(start, next - start));
    line_starting_ = next > 0 && src_[next - 1] == '\n';
    pos_ = next;
  }

  void LexRaw(size_t body_start) {
    line_ += CountNewlines(std::string_view(src_).substr(pos_, body_start - pos_));
    for (size_t p = src_.find("{%", body_start); p != std::string::npos;
         p = src_.find("{%", p + 1)) {
      size_t i = p + 2;
      char sign = i < src_.size() && (src_[i] == '-' || src_[i] == '+') ? src_[i] : 0;
      if (sign != 0) ++i;
      i += WhitespaceRun(src_, i);
      if (src_.compare(i, 6, "endraw") != 0) continue;
      i += 6;
      i += WhitespaceRun(src_, i);
      size_t next;
      if (src_.compare(i, 3, "+%}") == 0) {
        next = i + 3;
      } else if (src_.compare(i, 3, "-%}") == 0) {
        next = i + 3 + WhitespaceRun(src_, i + 3);
      } else if (src_.compare(i, 2, "%}") == 0) {
        next = i + 2;
        if (next < src_.size() && src_[next] == '\n') ++next;
      } else {
        continue;
      }
      line_starting_ = false;
      std::string_view body = std::string_view(src_).substr(body_start, p - body_start);
      EmitText(body, sign, true);
      line_ += CountNewlines(std::string_view(src_).substr(body_start, next - body_start));
      line_starting_ = src_[next - 1] == '\n';
      pos_ = next;
      return;
    }
    throw Error(absl::StatusCode::kInvalidArgument, "Missing end of raw directive", line_);
  }

  // Matches the end delimiter at i (when brackets are balanced); returns the
  // position after it (and the whitespace it strips), or 0.
  size_t MatchEnd(size_t i, bool block) const {
    if (block) {
      if (src_.compare(i, 3, "-%}") == 0) return i + 3 + WhitespaceRun(src_, i + 3);
      if (src_.compare(i, 3, "+%}") == 0) return i + 3;
      if (src_.compare(i, 2, "%}") == 0) {
        return i + 2 + (i + 2 < src_.size() && src_[i + 2] == '\n' ? 1 : 0);
      }
      return 0;
    }
    if (src_.compare(i, 3, "-}}") == 0) return i + 3 + WhitespaceRun(src_, i + 3);
    if (src_.compare(i, 2, "}}") == 0) return i + 2;
    return 0;
  }

  void LexTag(size_t i, bool block) {
    Emit(block ? TokenType::kBlockBegin : TokenType::kVariableBegin, "");
    std::string balance;
    while (true) {
      if (i >= src_.size()) {
        throw Error(absl::StatusCode::kInvalidArgument,
                    StrCat("unexpected end of template, expected '", block ? "%}" : "}}", "'"),
                    line_);
      }
      if (balance.empty()) {
        if (size_t end = MatchEnd(i, block); end != 0) {
          Emit(block ? TokenType::kBlockEnd : TokenType::kVariableEnd, "");
          line_ += CountNewlines(std::string_view(src_).substr(i, end - i));
          line_starting_ = src_[end - 1] == '\n';
          pos_ = end;
          return;
        }
      }
      if (size_t ws = WhitespaceRun(src_, i); ws > 0) {
        line_ += CountNewlines(std::string_view(src_).substr(i, ws));
        i += ws;
        continue;
      }
      char c = src_[i];
      if (IsDigit(c)) {
        i = LexNumber(i);
        continue;
      }
      if (IsNameStart(c)) {
        size_t j = i;
        while (j < src_.size() && IsNameChar(src_[j])) ++j;
        Emit(TokenType::kName, src_.substr(i, j - i));
        i = j;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t j = i + 1;
        while (j < src_.size() && src_[j] != c) j += src_[j] == '\\' ? 2 : 1;
        if (j >= src_.size()) FailAt(line_, StrCat("unexpected char '", std::string(1, c), "'"));
        std::string_view body = std::string_view(src_).substr(i + 1, j - i - 1);
        Emit(TokenType::kString, Unescape(body, line_));
        line_ += CountNewlines(body);
        i = j + 1;
        continue;
      }
      static constexpr std::string_view kOps2[] = {"**", "//", "==", "!=", ">=", "<="};
      std::string op;
      for (std::string_view two : kOps2) {
        if (src_.compare(i, 2, two) == 0) op = std::string(two);
      }
      if (op.empty() && std::string_view("+-/*%~[](){}><=.:|,;").find(c) != std::string::npos) {
        op = std::string(1, c);
      }
      if (op.empty()) {
        size_t len = 1;
        char32_t cp = CodePointAt(src_, i, &len);
        std::string shown;
        text::AppendUtf8(cp, &shown);
        FailAt(line_, StrCat("unexpected char '", shown, "'"));
      }
      if (op == "(" || op == "[" || op == "{") {
        balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      } else if (op == ")" || op == "]" || op == "}") {
        if (balance.empty()) FailAt(line_, StrCat("unexpected '", op, "'"));
        if (balance.back() != op[0]) {
          FailAt(line_,
                 StrCat("unexpected '", op, "', expected '", std::string(1, balance.back()), "'"));
        }
        balance.pop_back();
      }
      Emit(TokenType::kOperator, op);
      i += op.size();
    }
  }

  // Digits with single underscores between them: the end, or `at` if none.
  size_t Digits(size_t at, int base) const {
    auto ok = [&](char c) {
      if (base == 16) return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
      if (base == 8) return c >= '0' && c <= '7';
      if (base == 2) return c == '0' || c == '1';
      return IsDigit(c);
    };
    size_t i = at;
    if (i >= src_.size() || !ok(src_[i])) return at;
    while (true) {
      while (i < src_.size() && ok(src_[i])) ++i;
      if (i + 1 < src_.size() && src_[i] == '_' && ok(src_[i + 1])) {
        ++i;
        continue;
      }
      return i;
    }
  }

  size_t LexNumber(size_t i) {
    bool after_dot = i > 0 && src_[i - 1] == '.';
    // Float: digits, then a fraction and/or an exponent.
    if (!after_dot) {
      size_t int_end = Digits(i, 10);
      size_t j = int_end;
      bool fraction = false;
      if (j < src_.size() && src_[j] == '.') {
        size_t f = Digits(j + 1, 10);
        if (f > j + 1) {
          j = f;
          fraction = true;
        }
      }
      size_t k = j;
      bool exponent = false;
      if (k < src_.size() && (src_[k] == 'e' || src_[k] == 'E')) {
        size_t e = k + 1;
        if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
        size_t x = Digits(e, 10);
        if (x > e) {
          k = x;
          exponent = true;
        }
      }
      if (fraction || exponent) {
        std::string digits;
        for (size_t p = i; p < k; ++p) {
          if (src_[p] != '_') digits.push_back(src_[p]);
        }
        Token t{TokenType::kFloat, digits, line_};
        t.float_value = std::strtod(digits.c_str(), nullptr);
        tokens_.push_back(std::move(t));
        return k;
      }
    }
    size_t end;
    int base = 10;
    size_t body = i;
    char next = i + 1 < src_.size() ? src_[i + 1] : 0;
    if (src_[i] == '0' &&
        (next == 'b' || next == 'B' || next == 'o' || next == 'O' || next == 'x' || next == 'X')) {
      base = (next == 'b' || next == 'B') ? 2 : (next == 'o' || next == 'O') ? 8 : 16;
      // 0x(_?[0-9a-f])+
      size_t j = i + 2;
      if (j < src_.size() && src_[j] == '_') ++j;
      end = Digits(j, base);
      if (end == j) {
        end = i + 1;  // just "0"
        base = 10;
      } else {
        body = i + 2;
      }
    } else if (src_[i] == '0') {
      // 0(_?0)*
      end = i + 1;
      while (true) {
        if (end < src_.size() && src_[end] == '0') {
          ++end;
        } else if (end + 1 < src_.size() && src_[end] == '_' && src_[end + 1] == '0') {
          end += 2;
        } else {
          break;
        }
      }
    } else {
      end = Digits(i, 10);
    }
    std::string digits;
    for (size_t p = body; p < end; ++p) {
      if (src_[p] != '_') digits.push_back(src_[p]);
    }
    errno = 0;
    long long v = std::strtoll(digits.c_str(), nullptr, base);
    if (errno == ERANGE) FailAt(line_, "integer literal too large");
    Token t{TokenType::kInteger, src_.substr(i, end - i), line_};
    t.int_value = v;
    tokens_.push_back(std::move(t));
    return end;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Tokenize(std::string_view source) { return Lexer(source).Run(); }

}  // namespace tandem::jinja
