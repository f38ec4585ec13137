#include "engine/tokenizer/jinja/text.h"

#include <locale.h>
#include <wctype.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <system_error>

namespace tandem::jinja::text {
namespace {

// The C library's Unicode character tables (glibc's C.UTF-8 locale); null
// where the locale is missing, and then only ASCII has case and letters.
locale_t UnicodeLocale() {
  static const locale_t locale = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
    if (l == static_cast<locale_t>(0)) l = newlocale(LC_CTYPE_MASK, "en_US.UTF-8", l);
    return l;
  }();
  return locale;
}

bool IsSurrogate(char32_t c) { return c >= 0xD800 && c <= 0xDFFF; }

char32_t MapUpper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  locale_t l = UnicodeLocale();
  if (l == static_cast<locale_t>(0) || IsSurrogate(c)) return c;
  return static_cast<char32_t>(towupper_l(static_cast<wint_t>(c), l));
}

char32_t MapLower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  locale_t l = UnicodeLocale();
  if (l == static_cast<locale_t>(0) || IsSurrogate(c)) return c;
  return static_cast<char32_t>(towlower_l(static_cast<wint_t>(c), l));
}

bool IsCased(char32_t c) { return IsUpper(c) || IsLower(c); }

void AppendUpper(char32_t c, std::string* out) {
  if (c == 0xDF) {  // German sharp s: Python's full mapping gives "SS".
    out->append("SS");
    return;
  }
  AppendUtf8(MapUpper(c), out);
}

}  // namespace

std::u32string Decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  for (size_t i = 0; i < n;) {
    unsigned char b = p[i];
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    int len = 0;
    char32_t cp = 0;
    char32_t min = 0;
    if ((b & 0xE0) == 0xC0) {
      len = 2, cp = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, cp = b & 0x0F, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, cp = b & 0x07, min = 0x10000;
    }
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) {
        ok = false;
      } else {
        cp = (cp << 6) | (p[i + k] & 0x3F);
      }
    }
    if (ok && (cp < min || cp > 0x10FFFF || IsSurrogate(cp))) ok = false;
    if (!ok) {
      out.push_back(0xDC00 + b);  // surrogateescape
      ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c >= 0xDC80 && c <= 0xDCFF) {
    out->push_back(static_cast<char>(c - 0xDC00));  // an escaped raw byte
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string Encode(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) AppendUtf8(c, &out);
  return out;
}

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

size_t Length(std::string_view s) { return IsAscii(s) ? s.size() : Decode(s).size(); }

bool IsSpace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool IsAlpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  locale_t l = UnicodeLocale();
  if (l == static_cast<locale_t>(0) || IsSurrogate(c)) return false;
  return iswalpha_l(static_cast<wint_t>(c), l) != 0 && !IsDecimal(c);
}

bool IsDecimal(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  // The common Nd blocks: Arabic-Indic, extended Arabic-Indic, Devanagari,
  // Bengali, Thai and fullwidth digits.
  static constexpr char32_t kZeros[] = {0x0660, 0x06F0, 0x07C0, 0x0966, 0x09E6, 0x0A66,
                                        0x0AE6, 0x0B66, 0x0BE6, 0x0C66, 0x0CE6, 0x0D66,
                                        0x0E50, 0x0ED0, 0x0F20, 0x1040, 0xFF10};
  for (char32_t z : kZeros) {
    if (c >= z && c <= z + 9) return true;
  }
  return false;
}

bool IsAlnum(char32_t c) { return IsAlpha(c) || IsDecimal(c); }

bool IsUpper(char32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z';
  return MapLower(c) != c;
}

bool IsLower(char32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z';
  return MapUpper(c) != c || c == 0xDF;
}

bool IsWordChar(char32_t c) { return c == '_' || IsAlnum(c); }

bool IsLineBreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

bool IsPrintable(char32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c <= 0xA0 || c == 0xAD) return false;
  if (c != ' ' && IsSpace(c)) return false;  // Zs, Zl, Zp
  if ((c >= 0x200B && c <= 0x200F) || (c >= 0x202A && c <= 0x202E) ||
      (c >= 0x2060 && c <= 0x206F) || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB) ||
      (c >= 0x0600 && c <= 0x0605) || c == 0x061C || c == 0x06DD || c == 0x070F || c == 0x180E ||
      c == 0x110BD || (c >= 0xE0000 && c <= 0xE007F)) {
    return false;  // Cf
  }
  if (IsSurrogate(c) || (c >= 0xE000 && c <= 0xF8FF) || c >= 0xF0000) return false;  // Cs, Co
  if ((c & 0xFFFE) == 0xFFFE || (c >= 0xFDD0 && c <= 0xFDEF)) return false;  // noncharacters
  return true;
}

std::string Upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (IsAscii(s)) {
    for (char c : s) out.push_back(static_cast<char>(MapUpper(static_cast<unsigned char>(c))));
    return out;
  }
  for (char32_t c : Decode(s)) AppendUpper(c, &out);
  return out;
}

std::string Lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (IsAscii(s)) {
    for (char c : s) out.push_back(static_cast<char>(MapLower(static_cast<unsigned char>(c))));
    return out;
  }
  for (char32_t c : Decode(s)) AppendUtf8(MapLower(c), &out);
  return out;
}

std::string Title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool previous_is_cased = false;
  for (char32_t c : Decode(s)) {
    if (previous_is_cased) {
      AppendUtf8(MapLower(c), &out);
    } else {
      AppendUpper(c, &out);
    }
    previous_is_cased = IsCased(c);
  }
  return out;
}

std::string Capitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool first = true;
  for (char32_t c : Decode(s)) {
    if (first) {
      AppendUpper(c, &out);
      first = false;
    } else {
      AppendUtf8(MapLower(c), &out);
    }
  }
  return out;
}

std::string SwapCase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : Decode(s)) {
    if (IsUpper(c)) {
      AppendUtf8(MapLower(c), &out);
    } else if (IsLower(c)) {
      AppendUpper(c, &out);
    } else {
      AppendUtf8(c, &out);
    }
  }
  return out;
}

std::string ReprString(std::string_view s) {
  std::u32string cps = Decode(s);
  bool has_single = false;
  bool has_double = false;
  for (char32_t c : cps) {
    has_single |= c == '\'';
    has_double |= c == '"';
  }
  char32_t quote = has_single && !has_double ? '"' : '\'';
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back(static_cast<char>(quote));
  char buf[16];
  for (char32_t c : cps) {
    if (c == quote || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out.append("\\t");
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\r') {
      out.append("\\r");
    } else if (IsPrintable(c)) {
      AppendUtf8(c, &out);
    } else {
      if (c <= 0xFF) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      } else if (c <= 0xFFFF) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
      }
      out.append(buf);
    }
  }
  out.push_back(static_cast<char>(quote));
  return out;
}

std::string ReprFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // The shortest round-tripping digits, then Python's layout: positional
  // notation for exponents in [-4, 16), scientific otherwise.
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, result.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::atoi(sci.c_str() + e + 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  int decpt = exponent + 1;  // position of the decimal point after the first digit
  std::string out = negative ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out.append("0.");
      out.append(static_cast<size_t>(-decpt), '0');
      out.append(digits);
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out.append(digits);
      out.append(decpt - digits.size(), '0');
      out.append(".0");
    } else {
      out.append(digits, 0, decpt);
      out.push_back('.');
      out.append(digits, decpt, std::string::npos);
    }
    return out;
  }
  out.push_back(digits[0]);
  if (digits.size() > 1) {
    out.push_back('.');
    out.append(digits, 1, std::string::npos);
  }
  int x = decpt - 1;
  std::snprintf(buf, sizeof(buf), "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
  out += buf;
  return out;
}

std::vector<std::u32string> SplitLines(const std::u32string& s, bool keepends) {
  std::vector<std::u32string> out;
  size_t i = 0;
  size_t n = s.size();
  while (i < n) {
    size_t j = i;
    while (j < n && !IsLineBreak(s[j])) ++j;
    size_t eol = j;
    if (j < n) {
      if (s[j] == '\r' && j + 1 < n && s[j + 1] == '\n') {
        j += 2;
      } else {
        ++j;
      }
      if (keepends) eol = j;
    }
    out.push_back(s.substr(i, eol - i));
    i = j;
  }
  return out;
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '"':
        out += "&#34;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace tandem::jinja::text
