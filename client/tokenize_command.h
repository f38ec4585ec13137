// `tandem tokenize --model=GGUF "TEXT"` and `tandem tokenize --model=GGUF
// --ids "1 2 3"`: the model's tokenizer without a daemon. It reads only the
// file's metadata, so vocabulary-only GGUFs work as well as whole models.
//
// TEXT becomes token ids as a Generate prompt does (special-token text
// parsed, BOS added when the vocabulary asks for it); --ids turns ids back
// into that text (tokenizer::BpeTokenizer::DecodeText). Without TEXT, stdin
// is read.
#ifndef TANDEM_CLIENT_TOKENIZE_COMMAND_H_
#define TANDEM_CLIENT_TOKENIZE_COMMAND_H_

#include <optional>
#include <ostream>
#include <string>

namespace tandem::client {

struct TokenizeOptions {
  std::string model_path;
  bool decode = false;  // --ids: `input` holds token ids, separated by spaces or commas
  std::string input;
};

// Prints the ids (one line, separated by spaces) or the text to `out`.
// Returns the exit code: 0 done, 1 the model file cannot be read, 2 bad input.
int RunTokenizeCommand(const TokenizeOptions& options, std::ostream& out, std::ostream& err);

}  // namespace tandem::client

#endif  // TANDEM_CLIENT_TOKENIZE_COMMAND_H_
