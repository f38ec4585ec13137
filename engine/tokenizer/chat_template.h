// Chat templates: turn a list of {role, content} messages into prompt tokens.
//
// Rather than running the model's Jinja template, we detect its family from
// the template text and render that family ourselves (tests compare the
// rendering with the Jinja template run by Hugging Face transformers).
// Special tokens in the template's own markup are tokens; special-token text
// inside message content is tokenized as plain text, so a user cannot forge
// a role boundary.
#ifndef TANDEM_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_
#define TANDEM_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/bpe_tokenizer.h"

namespace tandem::tokenizer {

enum class ChatTemplateFamily { kChatMl, kLlama3 };

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

class ChatTemplate {
 public:
  // Picks the family: `override_name` ("chatml", "llama3") when not empty,
  // else detected from the model's template text. Unknown or missing
  // templates without an override are errors that list the choices.
  static absl::StatusOr<ChatTemplate> Create(std::optional<std::string_view> model_template,
                                             std::string_view override_name);

  ChatTemplateFamily family() const { return family_; }
  std::string_view family_name() const;
  const std::string& default_system_prompt() const { return default_system_; }

  // InvalidArgument naming the message index when a role is unknown.
  absl::Status Validate(std::span<const ChatMessage> messages) const;

  // The prompt as text (special tokens spelled out), with the assistant's
  // turn opened at the end.
  std::string Render(std::span<const ChatMessage> messages) const;

  // The prompt as tokens. REQUIRES: Validate(messages).ok().
  std::vector<TokenId> Encode(const BpeTokenizer& tokenizer,
                              std::span<const ChatMessage> messages) const;

 private:
  // The prompt as alternating pieces: markup (special tokens parsed) and
  // content (plain text).
  struct Piece {
    std::string text;
    bool markup;
  };
  std::vector<Piece> Pieces(std::span<const ChatMessage> messages) const;

  ChatTemplateFamily family_ = ChatTemplateFamily::kChatMl;
  std::string default_system_;
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_
