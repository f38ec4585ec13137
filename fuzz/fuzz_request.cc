// Request validation on GenerateRequest messages parsed from arbitrary bytes:
// BuildRequest accepts, or refuses with INVALID_ARGUMENT whose message starts
// with a field name; what it accepts fits the context. response_format's JSON
// schemas and forced tool calls' tools are user text compiled by the grammar
// engine against the real vocabulary, so they are fuzzed here too.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/grammar/token_grammar.h"
#include "fuzz/fuzz_model.h"
#include "google/protobuf/stubs/logging.h"
#include "server/request_builder.h"
#include "tandem/v1/generate.pb.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Most inputs hold invalid UTF-8 in string fields, which protobuf refuses
  // with a log line each; the refusal is the behaviour under test, the lines
  // are noise.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  v1::GenerateRequest proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  const auto& model = fuzz::Model();
  // A Hermes-style template over the model's ChatML tokens, so that tools
  // are rendered and forced tool calls reach the grammar compiler (the
  // model's own template, which renders no tools, is fuzz_chat_template's).
  static constexpr std::string_view kHermesTemplate =
      "{%- if tools %}<|im_start|>system\n<tools>{%- for t in tools %}\n{{ t | tojson }}"
      "{%- endfor %}\n</tools><|im_end|>\n{%- endif %}{%- for m in messages %}"
      "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
      "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}";
  static const tokenizer::ChatTemplate* chat = [&] {
    auto c = tokenizer::ChatTemplate::Create(kHermesTemplate, "", model.tokenizer.get());
    if (!c.ok()) std::abort();
    return new tokenizer::ChatTemplate(*std::move(c));
  }();
  static const grammar::GrammarVocabulary* vocabulary = [&] {
    std::vector<tokenizer::TokenId> stop;
    if (auto eos = model.tokenizer->special().eos; eos.has_value()) stop.push_back(*eos);
    return grammar::GrammarVocabulary::Create(*model.tokenizer, stop).release();
  }();
  constexpr int32_t kContext = 2048;
  // Hermes: forced tool calls compile the request's tools into a grammar.
  server::ModelLimits limits{model.tokenizer.get(),          chat, kContext, 0, vocabulary,
                             server::ToolCallFormat::kHermes};
  auto built = server::BuildRequest(proto, limits, server::RequestDefaults{}, 42);
  if (!built.ok()) {
    if (built.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    if (built.status().message().find(':') == std::string::npos) std::abort();  // "field: ..."
    return 0;
  }
  const auto& r = built->request;
  const auto prompt = static_cast<int32_t>(r.prompt.size());
  if (prompt < 1 || prompt >= kContext || r.max_tokens < 1 || prompt + r.max_tokens > kContext) {
    std::abort();
  }
  return 0;
}
