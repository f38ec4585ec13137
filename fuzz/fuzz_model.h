// The real model's tokenizer and chat template, loaded once per fuzzer
// process (from $TANDEM_FUZZ_MODEL, else the default model under models/).
#ifndef TANDEM_FUZZ_FUZZ_MODEL_H_
#define TANDEM_FUZZ_FUZZ_MODEL_H_

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "engine/model/gguf_file.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/chat_template.h"

namespace tandem::fuzz {

struct FuzzModel {
  std::unique_ptr<model::GgufFile> file;
  std::unique_ptr<tokenizer::BpeTokenizer> tokenizer;
  std::optional<std::string_view> template_text;
};

inline const FuzzModel& Model() {
  static const FuzzModel* model = [] {
    const char* env = std::getenv("TANDEM_FUZZ_MODEL");
    const std::string path = env != nullptr ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    auto file = model::GgufFile::Open(path);
    if (!file.ok()) {
      std::fprintf(stderr, "fuzz: cannot open the model (%s); set TANDEM_FUZZ_MODEL\n",
                   std::string(file.status().message()).c_str());
      std::abort();
    }
    auto tok = tokenizer::BpeTokenizer::FromGguf(**file);
    if (!tok.ok()) std::abort();
    auto* m = new FuzzModel{*std::move(file), *std::move(tok), std::nullopt};
    if (auto t = m->file->GetString("tokenizer.chat_template"); t.ok()) m->template_text = *t;
    return m;
  }();
  return *model;
}

}  // namespace tandem::fuzz

#endif  // TANDEM_FUZZ_FUZZ_MODEL_H_
