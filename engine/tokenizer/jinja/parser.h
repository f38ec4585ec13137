// Builds the syntax tree from tokens with jinja2's grammar and operator
// precedence. Unknown filters and tests are errors here, at parse time, as
// they are when jinja2 compiles a template.
#ifndef TANDEM_ENGINE_TOKENIZER_JINJA_PARSER_H_
#define TANDEM_ENGINE_TOKENIZER_JINJA_PARSER_H_

#include <memory>
#include <string_view>

#include "engine/tokenizer/jinja/ast.h"

namespace tandem::jinja {

// Fails (internal::Error, with the line) on a syntax error.
std::unique_ptr<Program> ParseProgram(std::string_view source);

}  // namespace tandem::jinja

#endif  // TANDEM_ENGINE_TOKENIZER_JINJA_PARSER_H_
