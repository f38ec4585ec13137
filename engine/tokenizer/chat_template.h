// Chat templates: turn a conversation (messages, and the tools the model may
// call) into prompt tokens.
//
// The model's own template (tokenizer.chat_template, or a .jinja file) runs
// in our Jinja interpreter (engine/tokenizer/jinja/), with the variables
// Hugging Face transformers gives it (messages, tools, add_generation_prompt,
// bos_token, eos_token), so system, tool-call and tool-result turns are
// rendered as the model was trained; tests compare the output with
// transformers' own rendering byte for byte. Two built-in families (ChatML,
// Llama 3) remain for models without a template (--chat_template=chatml or
// llama3): plain system/user/assistant turns only.
//
// Special tokens in the template's own markup are tokens; special-token text
// inside message content is tokenized as plain text, so a user cannot forge
// a role boundary. (Content is rendered as given; occurrences of control
// tokens' text in it are bracketed by private-use markers before rendering
// and the bytes between them are refused as special tokens afterwards.)
#ifndef TANDEM_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_
#define TANDEM_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/bpe_tokenizer.h"

namespace tandem::jinja {
class Template;
}

namespace tandem::tokenizer {

enum class ChatTemplateFamily { kChatMl, kLlama3, kJinja };

struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object's text
};

struct ChatMessage {
  ChatMessage() = default;
  // A plain turn: {"user", "Hi"}.
  ChatMessage(std::string role_, std::string content_)
      : role(std::move(role_)), content(std::move(content_)) {}

  std::string role;  // system, user, assistant, tool (what the template knows)
  std::string content;
  std::vector<ChatToolCall> tool_calls;  // an assistant turn's
  std::string tool_call_id;              // a tool turn's
  std::string name;                      // a tool turn's tool
  std::string reasoning_content;         // an assistant turn's, where rendered
};

struct ChatTool {
  std::string name;
  std::string description;
  std::string parameters;  // JSON Schema text ("": none)
};

class ChatTemplate {
 public:
  // `override_name`: "" (the model's template, `model_template`), "chatml"
  // or "llama3" (built-in families), or a path ending in ".jinja" (a
  // template file). `tokenizer` gives the template bos_token and eos_token
  // and says which tokens are control tokens; without one (tests, fuzzers)
  // a model template is not run but its family detected from its text.
  // Errors: a template the interpreter cannot parse names the construct and
  // line; no template and no override lists the choices.
  static absl::StatusOr<ChatTemplate> Create(std::optional<std::string_view> model_template,
                                             std::string_view override_name,
                                             const BpeTokenizer* tokenizer = nullptr);

  ChatTemplateFamily family() const { return family_; }
  // "chatml", "llama3", "model" (the model's template) or the file's name.
  std::string_view family_name() const { return name_; }
  const std::string& default_system_prompt() const { return default_system_; }
  // The Jinja source ("" for the built-in families).
  const std::string& source() const { return source_; }

  // InvalidArgument naming the field: an empty conversation, a role that is
  // not system/user/assistant (built-in families, which render no tools
  // either) or not one of those, tool or ipython (Jinja templates, which may
  // refuse more when rendered), tools a Jinja template never mentions.
  absl::Status Validate(std::span<const ChatMessage> messages,
                        std::span<const ChatTool> tools = {}) const;

  // The prompt as text (special tokens spelled out). Errors: the template
  // refused the conversation (raise_exception), as InvalidArgument
  // "messages: ...".
  absl::StatusOr<std::string> Render(std::span<const ChatMessage> messages,
                                     std::span<const ChatTool> tools = {},
                                     bool add_generation_prompt = true) const;

  // The prompt as tokens, the assistant's turn opened at the end.
  absl::StatusOr<std::vector<TokenId>> Encode(const BpeTokenizer& tokenizer,
                                              std::span<const ChatMessage> messages,
                                              std::span<const ChatTool> tools = {}) const;

 private:
  // The prompt text, and for each byte whether it is markup (special
  // tokens recognized) or content (plain text).
  struct Marked {
    std::string text;
    std::vector<bool> markup;
  };
  absl::StatusOr<Marked> RenderMarked(std::span<const ChatMessage> messages,
                                      std::span<const ChatTool> tools,
                                      bool add_generation_prompt) const;
  Marked Family(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

  ChatTemplateFamily family_ = ChatTemplateFamily::kChatMl;
  std::string name_ = "chatml";
  std::string default_system_;
  std::string source_;
  std::shared_ptr<const jinja::Template> jinja_;
  std::string bos_token_, eos_token_;
  std::vector<std::string> control_texts_;  // protected in message content
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_
