#include "client/chat_template_command.h"

#include <iterator>

#include "engine/model/gguf_file.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/chat_template.h"
#include "nlohmann/json.hpp"
#include "server/openai_protocol.h"
#include "server/request_builder.h"

namespace tandem::client {

int RunChatTemplateCommand(const std::string& model_path, const std::string& template_file,
                           std::istream& in, std::ostream& out, std::ostream& err) {
  if (model_path.empty()) {
    err << "error: give --model=FILE.gguf (its tokenizer, and its template unless "
           "--template_file)\n";
    return 2;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::ordered_json conversation =
      nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (conversation.is_discarded() || !conversation.is_object()) {
    err << "error: stdin: expected a JSON object {\"messages\": [...], \"tools\": [...], "
           "\"add_generation_prompt\": true}\n";
    return 2;
  }
  bool add_generation_prompt = true;
  if (auto it = conversation.find("add_generation_prompt"); it != conversation.end()) {
    if (!it->is_boolean()) {
      err << "error: add_generation_prompt: must be a boolean\n";
      return 2;
    }
    add_generation_prompt = it->get<bool>();
    conversation.erase(it);
  }
  // The messages and tools are read as the HTTP API reads them.
  conversation["model"] = "-";
  std::variant<server::openai::ParsedRequest, server::openai::ApiError> parsed =
      server::openai::ParseRequest(conversation.dump(), server::openai::Endpoint::kChatCompletions);
  if (const auto* error = std::get_if<server::openai::ApiError>(&parsed)) {
    err << "error: " << error->message << "\n";
    return 2;
  }
  const v1::GenerateRequest& request = std::get<server::openai::ParsedRequest>(parsed).generate;
  absl::StatusOr<server::Conversation> turns =
      server::ConversationFromProto(request.messages(), request.tools());
  if (!turns.ok()) {
    err << "error: " << turns.status().message() << "\n";
    return 2;
  }

  absl::StatusOr<std::unique_ptr<model::GgufFile>> file = model::GgufFile::Open(model_path);
  if (!file.ok()) {
    err << "error: --model=" << model_path << ": " << file.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tok =
      tokenizer::BpeTokenizer::FromGguf(**file);
  if (!tok.ok()) {
    err << "error: --model=" << model_path << ": " << tok.status().message() << "\n";
    return 1;
  }
  std::optional<std::string_view> model_template;
  if (absl::StatusOr<std::string_view> t = (*file)->GetString("tokenizer.chat_template"); t.ok()) {
    model_template = *t;
  }
  absl::StatusOr<tokenizer::ChatTemplate> chat =
      tokenizer::ChatTemplate::Create(model_template, template_file, tok->get());
  if (!chat.ok()) {
    err << "error: " << chat.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<std::string> prompt =
      chat->Render(turns->messages, turns->tools, add_generation_prompt);
  if (!prompt.ok()) {
    err << "error: " << prompt.status().message() << "\n";
    return 1;
  }
  out << *prompt;
  return 0;
}

}  // namespace tandem::client
