// Splits a model's streamed output into what the API reports separately:
// plain content, reasoning (`<think>...</think>`), and tool calls in the
// format the model's chat template taught it:
//
//   kHermes   <tool_call>{"name": ..., "arguments": {...}}</tool_call>
//             (Hermes, Qwen 2.5/3, SmolLM3 and their kin; several in a row)
//   kMistral  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
//             or [TOOL_CALLS]name[ARGS]{...} (Mistral Nemo, Small 3.x, Devstral)
//   kLlama3   the whole answer is {"name": ..., "parameters": {...}}, maybe
//             after <|python_tag|> (Llama 3.1-3.3's JSON tool calling)
//
// Text before a call stays content. Output is held back only while it may
// still turn out to be markup (a prefix of "<tool_call>" at the end of the
// text so far, or the start of a Llama 3 answer that opens with "{").
// A call whose JSON does not parse is given back as content, as written.
#ifndef TANDEM_SERVER_TOOL_CALL_PARSER_H_
#define TANDEM_SERVER_TOOL_CALL_PARSER_H_

#include <string>
#include <string_view>
#include <vector>

namespace tandem::server {

enum class ToolCallFormat { kNone, kHermes, kMistral, kLlama3 };

// The format a chat template's text teaches (kNone when it teaches none).
ToolCallFormat ToolCallFormatOf(std::string_view chat_template);
std::string_view ToolCallFormatName(ToolCallFormat format);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object's text
};

// What one Push or Finish found.
struct ParsedOutput {
  std::string content;
  std::string reasoning;
  std::vector<ParsedToolCall> tool_calls;
};

class ToolCallParser {
 public:
  // `reasoning`: split off <think>...</think> (templates that render
  // reasoning). An answer may open inside the reasoning when the template
  // opened <think> itself (`starts_in_reasoning`).
  ToolCallParser(ToolCallFormat format, bool reasoning, bool starts_in_reasoning = false);

  ParsedOutput Push(std::string_view text);
  // A control token, which has no text of its own in the answer: the
  // markers [TOOL_CALLS] and <|python_tag|> are control tokens in their
  // vocabularies. Others are ignored.
  ParsedOutput PushControl(std::string_view token_text);
  // The end of the output: whatever was held back.
  ParsedOutput Finish();

 private:
  void Scan(ParsedOutput& out, bool final);
  bool ScanReasoning(ParsedOutput& out, bool final);
  bool ScanHermes(ParsedOutput& out, bool final);
  bool ScanMistral(ParsedOutput& out, bool final);
  bool ScanLlama3(ParsedOutput& out, bool final);

  const ToolCallFormat format_;
  const bool reasoning_;
  bool in_reasoning_;
  bool seen_content_ = false;  // for Llama 3: only an answer that opens with a call is one
  bool in_calls_ = false;      // Mistral and Llama 3: the rest of the answer is calls
  std::string pending_;        // text not yet classified
};

// Parses one call object {"name": ..., "arguments"|"parameters": {...}}
// into `call`; false when it is not one.
bool ParseToolCallObject(std::string_view json, ParsedToolCall* call);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_TOOL_CALL_PARSER_H_
