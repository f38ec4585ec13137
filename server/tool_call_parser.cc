#include "server/tool_call_parser.h"

#include "nlohmann/json.hpp"

namespace tandem::server {
namespace {

using nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

// The length of the longest suffix of `text` that is a proper prefix of
// `marker`: what may still become the marker when more text comes.
size_t PartialMarker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

std::string_view TrimSpace(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return {};
  const size_t end = s.find_last_not_of(" \t\r\n");
  return s.substr(begin, end - begin + 1);
}

// Mistral's calls after [TOOL_CALLS]: a JSON array of call objects, or
// name[ARGS]{...}. False when `text` is neither.
bool ParseMistralCalls(std::string_view text, std::vector<ParsedToolCall>* calls) {
  text = TrimSpace(text);
  if (!text.empty() && text.front() == '[') {
    const ordered_json array = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (array.is_discarded() || !array.is_array() || array.empty()) return false;
    for (const ordered_json& item : array) {
      ParsedToolCall call;
      if (!ParseToolCallObject(item.dump(), &call)) return false;
      calls->push_back(std::move(call));
    }
    return true;
  }
  const size_t args = text.find(kMistralArgs);
  if (args == std::string_view::npos) return false;
  ParsedToolCall call;
  call.name = std::string(TrimSpace(text.substr(0, args)));
  const std::string_view json = TrimSpace(text.substr(args + kMistralArgs.size()));
  const ordered_json arguments = ordered_json::parse(json, nullptr, false);
  if (call.name.empty() || arguments.is_discarded() || !arguments.is_object()) return false;
  call.arguments = arguments.dump();
  calls->push_back(std::move(call));
  return true;
}

}  // namespace

ToolCallFormat ToolCallFormatOf(std::string_view chat_template) {
  if (chat_template.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (chat_template.find(kMistralCalls) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (chat_template.find("<|start_header_id|>") != std::string_view::npos &&
      chat_template.find("tools") != std::string_view::npos) {
    return ToolCallFormat::kLlama3;
  }
  return ToolCallFormat::kNone;
}

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kLlama3:
      return "llama3-json";
    case ToolCallFormat::kNone:
      break;
  }
  return "none";
}

bool ParseToolCallObject(std::string_view json, ParsedToolCall* call) {
  const ordered_json object = ordered_json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded() || !object.is_object()) return false;
  auto name = object.find("name");
  if (name == object.end() || !name->is_string() || name->get<std::string>().empty()) {
    return false;
  }
  auto arguments = object.find("arguments");
  if (arguments == object.end()) arguments = object.find("parameters");
  if (arguments == object.end()) {
    call->arguments = "{}";
  } else if (arguments->is_object()) {
    call->arguments = arguments->dump();
  } else if (arguments->is_string()) {
    // Some models write the arguments as a JSON string of an object.
    const ordered_json inner = ordered_json::parse(arguments->get<std::string>(), nullptr, false);
    if (inner.is_discarded() || !inner.is_object()) return false;
    call->arguments = inner.dump();
  } else {
    return false;
  }
  call->name = name->get<std::string>();
  return true;
}

ToolCallParser::ToolCallParser(ToolCallFormat format, bool reasoning, bool starts_in_reasoning)
    : format_(format), reasoning_(reasoning), in_reasoning_(reasoning && starts_in_reasoning) {}

ParsedOutput ToolCallParser::Push(std::string_view text) {
  pending_ += text;
  ParsedOutput out;
  Scan(out, /*final=*/false);
  return out;
}

ParsedOutput ToolCallParser::PushControl(std::string_view token_text) {
  ParsedOutput out;
  const bool marker = (format_ == ToolCallFormat::kMistral && token_text == kMistralCalls) ||
                      (format_ == ToolCallFormat::kLlama3 && token_text == kPythonTag);
  if (!marker) return out;
  if (format_ == ToolCallFormat::kLlama3) {
    // <|python_tag|> opens a call wherever it comes.
    Scan(out, /*final=*/false);
    if (!in_calls_) {
      out.content += pending_;
      pending_.clear();
      in_calls_ = true;
    }
    return out;
  }
  // Mistral: what came before is content; calls follow (a second marker
  // separates two calls of the name[ARGS] form).
  Scan(out, /*final=*/false);
  if (in_calls_) {
    pending_ += kMistralCalls;
  } else {
    out.content += pending_;
    pending_.clear();
    in_calls_ = true;
  }
  return out;
}

ParsedOutput ToolCallParser::Finish() {
  ParsedOutput out;
  Scan(out, /*final=*/true);
  return out;
}

void ToolCallParser::Scan(ParsedOutput& out, bool final) {
  while (true) {
    if (reasoning_ && ScanReasoning(out, final)) continue;
    if (in_reasoning_) return;  // waiting for </think>
    bool progressed = false;
    switch (format_) {
      case ToolCallFormat::kHermes:
        progressed = ScanHermes(out, final);
        break;
      case ToolCallFormat::kMistral:
        progressed = ScanMistral(out, final);
        break;
      case ToolCallFormat::kLlama3:
        progressed = ScanLlama3(out, final);
        break;
      case ToolCallFormat::kNone:
        out.content += pending_;
        pending_.clear();
        break;
    }
    if (!progressed) return;
  }
}

bool ToolCallParser::ScanReasoning(ParsedOutput& out, bool final) {
  if (in_reasoning_) {
    const size_t close = pending_.find(kThinkClose);
    if (close != std::string::npos) {
      out.reasoning += pending_.substr(0, close);
      pending_.erase(0, close + kThinkClose.size());
      in_reasoning_ = false;
      return true;
    }
    const size_t keep = final ? 0 : PartialMarker(pending_, kThinkClose);
    out.reasoning += pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    return false;
  }
  // Reasoning opens the answer, if anywhere.
  if (seen_content_) return false;
  const std::string_view head = TrimSpace(pending_);
  if (head.substr(0, kThinkOpen.size()) == kThinkOpen) {
    pending_.erase(0, pending_.find(kThinkOpen) + kThinkOpen.size());
    in_reasoning_ = true;
    return true;
  }
  return false;
}

bool ToolCallParser::ScanHermes(ParsedOutput& out, bool final) {
  const size_t open = pending_.find(kHermesOpen);
  if (open == std::string::npos) {
    const size_t keep = final ? 0 : PartialMarker(pending_, kHermesOpen);
    // Before the first word of the answer, <think> may still be coming.
    if (!final && reasoning_ && !seen_content_ && TrimSpace(pending_).size() < kThinkOpen.size() &&
        std::string_view(kThinkOpen).substr(0, TrimSpace(pending_).size()) == TrimSpace(pending_)) {
      return false;
    }
    const std::string_view emit = std::string_view(pending_).substr(0, pending_.size() - keep);
    if (!TrimSpace(emit).empty()) seen_content_ = true;
    out.content += emit;
    pending_.erase(0, emit.size());
    return false;
  }
  if (open > 0) {
    out.content += pending_.substr(0, open);
    pending_.erase(0, open);
  }
  const size_t close = pending_.find(kHermesClose);
  if (close == std::string::npos && !final) return false;
  const std::string_view body = std::string_view(pending_).substr(
      kHermesOpen.size(),
      close == std::string::npos ? std::string::npos : close - kHermesOpen.size());
  ParsedToolCall call;
  if (ParseToolCallObject(TrimSpace(body), &call)) {
    out.tool_calls.push_back(std::move(call));
  } else {
    out.content +=
        close == std::string::npos ? pending_ : pending_.substr(0, close + kHermesClose.size());
  }
  seen_content_ = true;
  pending_.erase(0, close == std::string::npos ? std::string::npos : close + kHermesClose.size());
  return !pending_.empty();
}

bool ToolCallParser::ScanMistral(ParsedOutput& out, bool final) {
  if (!in_calls_) {
    // The marker may also arrive as text (a vocabulary without it as a
    // control token).
    const size_t marker = pending_.find(kMistralCalls);
    if (marker != std::string::npos) {
      out.content += pending_.substr(0, marker);
      pending_.erase(0, marker + kMistralCalls.size());
      in_calls_ = true;
      return true;
    }
    const size_t keep = final ? 0 : PartialMarker(pending_, kMistralCalls);
    out.content += pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    return false;
  }
  if (!final) return false;  // a call list is parsed whole, at the end
  std::vector<ParsedToolCall> calls;
  bool ok = true;
  size_t start = 0;
  while (ok && start <= pending_.size()) {
    const size_t next = pending_.find(kMistralCalls, start);
    const std::string_view piece = std::string_view(pending_).substr(
        start, next == std::string::npos ? std::string::npos : next - start);
    ok = ParseMistralCalls(piece, &calls);
    if (next == std::string::npos) break;
    start = next + kMistralCalls.size();
  }
  if (ok) {
    for (ParsedToolCall& call : calls) out.tool_calls.push_back(std::move(call));
  } else {
    out.content += std::string(kMistralCalls) + pending_;  // as written
  }
  pending_.clear();
  return false;
}

bool ToolCallParser::ScanLlama3(ParsedOutput& out, bool final) {
  if (!in_calls_) {
    // Only an answer that opens with "{" may be a call; hold it to the end.
    const std::string_view head = TrimSpace(pending_);
    if (!seen_content_ && (head.empty() || head.front() == '{')) {
      if (!final) return false;
      ParsedToolCall call;
      if (!head.empty() && ParseToolCallObject(head, &call)) {
        out.tool_calls.push_back(std::move(call));
      } else {
        out.content += pending_;
      }
      pending_.clear();
      return false;
    }
    seen_content_ = true;
    out.content += pending_;
    pending_.clear();
    return false;
  }
  if (!final) return false;
  // After <|python_tag|>: one call, or several separated by ";".
  std::vector<ParsedToolCall> calls;
  bool ok = true;
  std::string_view rest = pending_;
  while (ok && !TrimSpace(rest).empty()) {
    const size_t semicolon = rest.find("};");
    const std::string_view one =
        semicolon == std::string_view::npos ? rest : rest.substr(0, semicolon + 1);
    ParsedToolCall call;
    ok = ParseToolCallObject(TrimSpace(one), &call);
    if (ok) calls.push_back(std::move(call));
    rest = semicolon == std::string_view::npos ? std::string_view() : rest.substr(semicolon + 2);
  }
  if (ok && !calls.empty()) {
    for (ParsedToolCall& call : calls) out.tool_calls.push_back(std::move(call));
  } else {
    out.content += pending_;
  }
  pending_.clear();
  return false;
}

}  // namespace tandem::server
