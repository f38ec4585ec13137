// Splits a template into tokens as jinja2's lexer does with trim_blocks and
// lstrip_blocks on: text, the {{ }} and {% %} delimiters (comments and
// whitespace dropped), and the names, literals and operators inside them.
#ifndef TANDEM_ENGINE_TOKENIZER_JINJA_LEXER_H_
#define TANDEM_ENGINE_TOKENIZER_JINJA_LEXER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::jinja {

enum class TokenType : uint8_t {
  kData,           // template text
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,    // value: the unescaped text
  kInteger,   // int_value
  kFloat,     // float_value
  kOperator,  // value: the operator, e.g. "**" or "("
  kEof,
};

struct Token {
  TokenType type;
  std::string value;
  int line = 1;
  int64_t int_value = 0;
  double float_value = 0;

  bool IsOp(std::string_view op) const { return type == TokenType::kOperator && value == op; }
  bool IsName(std::string_view name) const { return type == TokenType::kName && value == name; }
};

// Fails (internal::Error) on a lexical error: an unterminated tag, string or
// comment, an unexpected character, unbalanced brackets.
std::vector<Token> Tokenize(std::string_view source);

}  // namespace tandem::jinja

#endif  // TANDEM_ENGINE_TOKENIZER_JINJA_LEXER_H_
