#include "engine/tokenizer/chat_template.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "common/strings.h"
#include "engine/tokenizer/jinja/jinja.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer {
namespace {

using nlohmann::ordered_json;

constexpr std::string_view kChoices = "chatml, llama3, or a FILE.jinja";

// Bracket control-token text inside message content (U+E000, U+E001).
constexpr std::string_view kContentOpen = "\xEE\x80\x80";
constexpr std::string_view kContentClose = "\xEE\x80\x81";

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

absl::StatusOr<std::string> ReadTemplateFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        StrCat("--chat_template=", path, ": cannot read the template file"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// `text` with every occurrence of a control token's text bracketed.
std::string ProtectContent(std::string_view text, const std::vector<std::string>& controls) {
  std::string out(text);
  for (const std::string& control : controls) {
    if (out.find(control) == std::string::npos) continue;
    std::string next;
    size_t at = 0;
    for (size_t hit = out.find(control); hit != std::string::npos; hit = out.find(control, at)) {
      next += out.substr(at, hit - at);
      next += StrCat(kContentOpen, control, kContentClose);
      at = hit + control.size();
    }
    next += out.substr(at);
    out = std::move(next);
  }
  return out;
}

// A JSON text as a value (an object the template can walk); text that is not
// JSON stays a string.
ordered_json JsonOrString(const std::string& text) {
  ordered_json value = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return text;
  return value;
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Create(std::optional<std::string_view> model_template,
                                                  std::string_view override_name,
                                                  const BpeTokenizer* tokenizer) {
  ChatTemplate t;
  std::optional<std::string> source;
  if (override_name == "chatml") {
    t.family_ = ChatTemplateFamily::kChatMl;
  } else if (override_name == "llama3") {
    t.family_ = ChatTemplateFamily::kLlama3;
  } else if (override_name.size() > 6 &&
             override_name.substr(override_name.size() - 6) == ".jinja") {
    absl::StatusOr<std::string> text = ReadTemplateFile(std::string(override_name));
    if (!text.ok()) return text.status();
    source = *std::move(text);
    t.name_ = std::string(override_name.substr(override_name.rfind('/') + 1));
  } else if (!override_name.empty()) {
    return absl::InvalidArgumentError(StrCat(
        "--chat_template='", override_name, "' is not a known template (choices: ", kChoices, ")"));
  } else if (!model_template.has_value()) {
    return absl::FailedPreconditionError(StrCat(
        "the model has no tokenizer.chat_template; pass --chat_template (choices: ", kChoices,
        ")"));
  } else if (tokenizer != nullptr) {
    source = std::string(*model_template);
    t.name_ = "model";
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

  if (source.has_value()) {
    absl::StatusOr<jinja::Template> parsed = jinja::Template::Parse(*source);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(StrCat("the chat template (", t.name_,
                                               ") cannot be run: ", parsed.status().message(),
                                               "; pass --chat_template (choices: ", kChoices, ")"));
    }
    t.family_ = ChatTemplateFamily::kJinja;
    t.jinja_ = std::make_shared<const jinja::Template>(*std::move(parsed));
    t.source_ = *std::move(source);
    if (tokenizer != nullptr) {
      const SpecialTokens& special = tokenizer->special();
      if (special.bos) t.bos_token_ = tokenizer->TokenBytes(*special.bos);
      if (special.eos) t.eos_token_ = tokenizer->TokenBytes(*special.eos);
      for (TokenId id = 0; id < tokenizer->vocab_size(); ++id) {
        const std::string& text = tokenizer->TokenBytes(id);
        if (tokenizer->Kind(id) == TokenKind::kControl && text.size() > 1) {
          t.control_texts_.push_back(text);
        }
      }
    }
    return t;
  }
  t.name_ = t.family_ == ChatTemplateFamily::kChatMl ? "chatml" : "llama3";
  if (t.family_ == ChatTemplateFamily::kChatMl && model_template.has_value()) {
    t.default_system_ = DefaultChatMlSystem(*model_template);
  }
  return t;
}

absl::Status ChatTemplate::Validate(std::span<const ChatMessage> messages,
                                    std::span<const ChatTool> tools) const {
  if (messages.empty()) {
    return absl::InvalidArgumentError("messages: at least one message is required");
  }
  if (family_ == ChatTemplateFamily::kJinja) {
    if (!tools.empty() && source_.find("tools") == std::string::npos) {
      return absl::InvalidArgumentError(
          StrCat("tools: this chat template (", name_,
                 ") renders no tools; serve one that does (--chat_template=FILE.jinja)"));
    }
    // The roles chat templates know (ipython: Llama 3's tool results).
    for (size_t i = 0; i < messages.size(); ++i) {
      const std::string& role = messages[i].role;
      if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
          role != "ipython") {
        return absl::InvalidArgumentError(
            StrCat("messages[", i, "].role: unknown role '", role,
                   "' (expected system, user, assistant, tool or ipython)"));
      }
    }
    return absl::OkStatus();
  }
  if (!tools.empty()) {
    return absl::InvalidArgumentError(
        StrCat("tools: the built-in ", name_,
               " template renders no tools; serve the model's own template "
               "(--chat_template unset, or --chat_template=FILE.jinja)"));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(StrCat("messages[", i, "].role: unknown role '", m.role,
                                               "' (expected system, user or assistant)"));
    }
    if (!m.tool_calls.empty()) {
      return absl::InvalidArgumentError(StrCat("messages[", i, "].tool_calls: the built-in ", name_,
                                               " template renders no tool calls"));
    }
  }
  return absl::OkStatus();
}

ChatTemplate::Marked ChatTemplate::Family(std::span<const ChatMessage> messages,
                                          bool add_generation_prompt) const {
  Marked out;
  auto add = [&out](std::string_view text, bool markup) {
    out.text += text;
    out.markup.insert(out.markup.end(), text.size(), markup);
  };
  if (family_ == ChatTemplateFamily::kChatMl) {
    if (!default_system_.empty() && (messages.empty() || messages[0].role != "system")) {
      add("<|im_start|>system\n", true);
      add(default_system_, false);
      add("<|im_end|>\n", true);
    }
    for (const ChatMessage& m : messages) {
      add(StrCat("<|im_start|>", m.role, "\n"), true);
      add(m.content, false);
      add("<|im_end|>\n", true);
    }
    if (add_generation_prompt) add("<|im_start|>assistant\n", true);
  } else {
    add("<|begin_of_text|>", true);
    for (const ChatMessage& m : messages) {
      add(StrCat("<|start_header_id|>", m.role, "<|end_header_id|>\n\n"), true);
      add(std::string(absl::StripAsciiWhitespace(AbslView(m.content))), false);
      add("<|eot_id|>", true);
    }
    if (add_generation_prompt) add("<|start_header_id|>assistant<|end_header_id|>\n\n", true);
  }
  return out;
}

absl::StatusOr<ChatTemplate::Marked> ChatTemplate::RenderMarked(
    std::span<const ChatMessage> messages, std::span<const ChatTool> tools,
    bool add_generation_prompt) const {
  if (absl::Status s = Validate(messages, tools); !s.ok()) return s;
  if (family_ != ChatTemplateFamily::kJinja) return Family(messages, add_generation_prompt);

  // The variables transformers' apply_chat_template gives a template.
  ordered_json context = ordered_json::object();
  ordered_json& list = context["messages"] = ordered_json::array();
  for (const ChatMessage& m : messages) {
    ordered_json message = {{"role", m.role}};
    if (m.content.empty() && !m.tool_calls.empty()) {
      message["content"] = nullptr;
    } else {
      message["content"] = ProtectContent(m.content, control_texts_);
    }
    if (!m.tool_calls.empty()) {
      ordered_json& calls = message["tool_calls"] = ordered_json::array();
      for (const ChatToolCall& call : m.tool_calls) {
        ordered_json c = {
            {"type", "function"},
            {"function", {{"name", call.name}, {"arguments", JsonOrString(call.arguments)}}}};
        if (!call.id.empty()) c["id"] = call.id;
        calls.push_back(std::move(c));
      }
    }
    if (!m.tool_call_id.empty()) message["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) message["name"] = m.name;
    if (!m.reasoning_content.empty()) message["reasoning_content"] = m.reasoning_content;
    list.push_back(std::move(message));
  }
  if (!tools.empty()) {
    ordered_json& list_of_tools = context["tools"] = ordered_json::array();
    for (const ChatTool& tool : tools) {
      ordered_json function = {{"name", tool.name}};
      if (!tool.description.empty()) function["description"] = tool.description;
      if (!tool.parameters.empty()) function["parameters"] = JsonOrString(tool.parameters);
      list_of_tools.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
  }
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = bos_token_;
  context["eos_token"] = eos_token_;
  absl::StatusOr<std::string> rendered = jinja_->Render(context);
  if (!rendered.ok()) {
    return absl::InvalidArgumentError(StrCat(
        "messages: the chat template refused the conversation: ", rendered.status().message()));
  }
  // Drop the markers; the bytes between them are content.
  Marked out;
  out.text.reserve(rendered->size());
  bool content = false;
  for (size_t i = 0; i < rendered->size();) {
    const std::string_view rest = std::string_view(*rendered).substr(i);
    if (rest.substr(0, kContentOpen.size()) == kContentOpen) {
      content = true;
      i += kContentOpen.size();
    } else if (rest.substr(0, kContentClose.size()) == kContentClose) {
      content = false;
      i += kContentClose.size();
    } else {
      out.text.push_back((*rendered)[i]);
      out.markup.push_back(!content);
      ++i;
    }
  }
  return out;
}

absl::StatusOr<std::string> ChatTemplate::Render(std::span<const ChatMessage> messages,
                                                 std::span<const ChatTool> tools,
                                                 bool add_generation_prompt) const {
  absl::StatusOr<Marked> marked = RenderMarked(messages, tools, add_generation_prompt);
  if (!marked.ok()) return marked.status();
  return std::move(marked->text);
}

absl::StatusOr<std::vector<TokenId>> ChatTemplate::Encode(const BpeTokenizer& tokenizer,
                                                          std::span<const ChatMessage> messages,
                                                          std::span<const ChatTool> tools) const {
  absl::StatusOr<Marked> marked = RenderMarked(messages, tools, /*add_generation_prompt=*/true);
  if (!marked.ok()) return marked.status();
  return tokenizer.EncodeSpecialWhere(marked->text,
                                      [&](size_t offset) { return marked->markup[offset]; });
}

}  // namespace tandem::tokenizer
