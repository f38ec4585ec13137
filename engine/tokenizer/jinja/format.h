// Python's string formatting: str.format() with its format-spec mini-language,
// and printf-style `str % args`.
#ifndef TANDEM_ENGINE_TOKENIZER_JINJA_FORMAT_H_
#define TANDEM_ENGINE_TOKENIZER_JINJA_FORMAT_H_

#include <string>
#include <string_view>

#include "engine/tokenizer/jinja/value.h"

namespace tandem::jinja {

// format(value, spec).
std::string FormatValue(const Value& v, std::string_view spec);
// fmt.format(*args, **kwargs); markup: HTML-escape the substituted values
// (Markup.format).
std::string StrFormat(std::string_view fmt, const CallArgs& args, bool markup);
// format % args (Markup % args escapes the arguments).
Value PercentFormat(const Value& format, const Value& args);

}  // namespace tandem::jinja

#endif  // TANDEM_ENGINE_TOKENIZER_JINJA_FORMAT_H_
