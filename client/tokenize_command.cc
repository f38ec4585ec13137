#include "client/tokenize_command.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/strings.h"
#include "engine/model/gguf_file.h"
#include "engine/tokenizer/bpe_tokenizer.h"

namespace tandem::client {

int RunTokenizeCommand(const TokenizeOptions& options, std::ostream& out, std::ostream& err) {
  if (options.model_path.empty()) {
    err << "error: give --model=FILE.gguf (a model or a vocabulary-only GGUF)\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<model::GgufFile>> file = model::GgufFile::Open(options.model_path);
  if (!file.ok()) {
    err << "error: --model=" << options.model_path << ": " << file.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tok =
      tokenizer::BpeTokenizer::FromGguf(**file);
  if (!tok.ok()) {
    err << "error: --model=" << options.model_path << ": " << tok.status().message() << "\n";
    return 1;
  }
  if (options.decode) {
    std::vector<tokenizer::TokenId> ids;
    for (absl::string_view field :
         absl::StrSplit(AbslView(options.input), absl::ByAnyChar(" ,\t\n"), absl::SkipEmpty())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(field, &id) || id < 0 || id >= (*tok)->vocab_size()) {
        err << "error: --ids: '" << field << "' is not a token id (0.." << (*tok)->vocab_size() - 1
            << ")\n";
        return 2;
      }
      ids.push_back(id);
    }
    out << (*tok)->DecodeText(ids) << "\n";
    return 0;
  }
  std::vector<tokenizer::TokenId> ids = (*tok)->Encode(options.input, /*parse_special=*/true);
  if ((*tok)->add_bos()) ids.insert(ids.begin(), *(*tok)->special().bos);
  for (size_t i = 0; i < ids.size(); ++i) out << (i == 0 ? "" : " ") << ids[i];
  out << "\n";
  return 0;
}

}  // namespace tandem::client
