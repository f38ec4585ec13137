// Python's str semantics over UTF-8: code points, whitespace and case, and the
// repr of strings and floats. Templates see strings as sequences of code
// points (len, slicing, reversal), as Python does.
//
// Invalid UTF-8 bytes decode to the lone surrogates U+DC80..U+DCFF (Python's
// "surrogateescape") and encode back to the same byte, so that no input byte
// is lost or changed by a round trip.
#ifndef TANDEM_ENGINE_TOKENIZER_JINJA_TEXT_H_
#define TANDEM_ENGINE_TOKENIZER_JINJA_TEXT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::jinja::text {

std::u32string Decode(std::string_view utf8);
std::string Encode(std::u32string_view code_points);
void AppendUtf8(char32_t cp, std::string* out);
bool IsAscii(std::string_view s);
// Number of code points (what Python's len() says).
size_t Length(std::string_view utf8);

// str.isspace() for one code point.
bool IsSpace(char32_t c);
bool IsAlpha(char32_t c);
bool IsDecimal(char32_t c);
bool IsAlnum(char32_t c);
bool IsUpper(char32_t c);
bool IsLower(char32_t c);
// \w in Python's re: alphanumeric or underscore.
bool IsWordChar(char32_t c);
// Whether the code point is a line boundary for str.splitlines().
bool IsLineBreak(char32_t c);
// Whether Python's repr() prints the code point as is (str.isprintable()).
bool IsPrintable(char32_t c);

// Full-string case mapping as str.upper()/lower()/title()/capitalize()/
// swapcase() do (simple case mapping, plus U+00DF upper-casing to "SS").
std::string Upper(std::string_view s);
std::string Lower(std::string_view s);
std::string Title(std::string_view s);
std::string Capitalize(std::string_view s);
std::string SwapCase(std::string_view s);

// repr() of a str: quotes and escapes as CPython chooses them.
std::string ReprString(std::string_view s);
// repr() of a float: the shortest string that round-trips ("1.0", "0.1",
// "1e-05", "1e+16", "inf", "nan").
std::string ReprFloat(double d);

// str.splitlines(keepends).
std::vector<std::u32string> SplitLines(const std::u32string& s, bool keepends);

// HTML escaping as markupsafe.escape: & < > ' " become entities.
std::string HtmlEscape(std::string_view s);

}  // namespace tandem::jinja::text

#endif  // TANDEM_ENGINE_TOKENIZER_JINJA_TEXT_H_
