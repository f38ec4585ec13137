#include "engine/tokenizer/chat_template.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "common/strings.h"

namespace tandem::tokenizer {
namespace {

constexpr std::string_view kChoices = "chatml, llama3";

// ChatML templates that open with a fixed system turn when the conversation
// has none spell it as a literal: <|im_start|>system\n...<|im_end|>.
std::string DefaultChatMlSystem(std::string_view tmpl) {
  constexpr std::string_view kOpen = "<|im_start|>system\n";
  constexpr std::string_view kClose = "<|im_end|>";
  const size_t open = tmpl.find(kOpen);
  if (open == std::string_view::npos) return {};
  const size_t start = open + kOpen.size();
  const size_t close = tmpl.find(kClose, start);
  if (close == std::string_view::npos) return {};
  const std::string_view literal = tmpl.substr(start, close - start);
  // An expression (e.g. ' + messages[0]['content'] + ') is not a default.
  if (literal.find_first_of("'\"{}") != std::string_view::npos) return {};
  return std::string(literal);
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Create(std::optional<std::string_view> model_template,
                                                  std::string_view override_name) {
  ChatTemplate t;
  if (!override_name.empty()) {
    if (override_name == "chatml") {
      t.family_ = ChatTemplateFamily::kChatMl;
    } else if (override_name == "llama3") {
      t.family_ = ChatTemplateFamily::kLlama3;
    } else {
      return absl::InvalidArgumentError(StrCat("--chat_template='", override_name,
                                               "' is not a known template (choices: ", kChoices,
                                               ")"));
    }
  } else if (!model_template.has_value()) {
    return absl::FailedPreconditionError(StrCat(
        "the model has no tokenizer.chat_template; pass --chat_template (choices: ", kChoices,
        ")"));
  } else if (model_template->find("<|im_start|>") != std::string_view::npos) {
    t.family_ = ChatTemplateFamily::kChatMl;
  } else if (model_template->find("<|start_header_id|>") != std::string_view::npos) {
    t.family_ = ChatTemplateFamily::kLlama3;
  } else {
    return absl::FailedPreconditionError(
        StrCat("the model's chat template is not a known family; pass --chat_template "
               "(choices: ",
               kChoices, ")"));
  }
  if (t.family_ == ChatTemplateFamily::kChatMl && model_template.has_value()) {
    t.default_system_ = DefaultChatMlSystem(*model_template);
  }
  return t;
}

std::string_view ChatTemplate::family_name() const {
  return family_ == ChatTemplateFamily::kChatMl ? "chatml" : "llama3";
}

absl::Status ChatTemplate::Validate(std::span<const ChatMessage> messages) const {
  if (messages.empty())
    return absl::InvalidArgumentError("messages: at least one message is required");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(StrCat("messages[", i, "].role: unknown role '", role,
                                               "' (expected system, user or assistant)"));
    }
  }
  return absl::OkStatus();
}

std::vector<ChatTemplate::Piece> ChatTemplate::Pieces(std::span<const ChatMessage> messages) const {
  std::vector<Piece> pieces;
  switch (family_) {
    case ChatTemplateFamily::kChatMl:
      if (!default_system_.empty() && (messages.empty() || messages[0].role != "system")) {
        pieces.push_back({"<|im_start|>system\n", true});
        pieces.push_back({default_system_, false});
        pieces.push_back({"<|im_end|>\n", true});
      }
      for (const ChatMessage& m : messages) {
        pieces.push_back({StrCat("<|im_start|>", m.role, "\n"), true});
        pieces.push_back({m.content, false});
        pieces.push_back({"<|im_end|>\n", true});
      }
      pieces.push_back({"<|im_start|>assistant\n", true});
      break;
    case ChatTemplateFamily::kLlama3:
      pieces.push_back({"<|begin_of_text|>", true});
      for (const ChatMessage& m : messages) {
        pieces.push_back({StrCat("<|start_header_id|>", m.role, "<|end_header_id|>\n\n"), true});
        pieces.push_back({std::string(absl::StripAsciiWhitespace(m.content)), false});
        pieces.push_back({"<|eot_id|>", true});
      }
      pieces.push_back({"<|start_header_id|>assistant<|end_header_id|>\n\n", true});
      break;
  }
  return pieces;
}

std::string ChatTemplate::Render(std::span<const ChatMessage> messages) const {
  std::string out;
  for (const Piece& p : Pieces(messages)) out += p.text;
  return out;
}

std::vector<TokenId> ChatTemplate::Encode(const BpeTokenizer& tokenizer,
                                          std::span<const ChatMessage> messages) const {
  std::string text;
  std::vector<bool> markup;
  for (const Piece& p : Pieces(messages)) {
    text += p.text;
    markup.insert(markup.end(), p.text.size(), p.markup);
  }
  return tokenizer.EncodeSpecialWhere(text, [&](size_t offset) { return markup[offset]; });
}

}  // namespace tandem::tokenizer
