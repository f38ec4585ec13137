#include "server/forced_tool_call.h"

#include <string>

#include "common/strings.h"
#include "nlohmann/json.hpp"

namespace tandem::server {

absl::StatusOr<grammar::GrammarVocabulary::TaggedJson> ForcedToolCalls(
    ToolCallFormat format, const google::protobuf::RepeatedPtrField<v1::Tool>& tools,
    std::string_view tool_choice, bool parallel) {
  // Ordered: properties are written in the order the schema lists them.
  using json = nlohmann::ordered_json;
  grammar::GrammarVocabulary::TaggedJson calls;
  std::string_view arguments_key = "arguments";
  switch (format) {
    case ToolCallFormat::kHermes:
      calls = {std::string("<tool_call>\n"), "", std::string("\n</tool_call>"),
               std::string(1, '\n'), parallel};
      break;
    case ToolCallFormat::kLlama3:
      arguments_key = "parameters";
      break;
    case ToolCallFormat::kMistral:
      return absl::InvalidArgumentError(
          "tool_choice: forcing a call is not available for this model's tool-call format "
          "(mistral: its [TOOL_CALLS] marker is a control token, which constrained output does "
          "not produce); use auto");
    case ToolCallFormat::kNone:
      return absl::InvalidArgumentError(
          "tool_choice: forcing a call needs a chat template whose tool-call format this server "
          "knows (hermes, llama3); this model's template teaches none; use auto");
  }
  const bool required = tool_choice == "required";
  json choices = json::array();
  for (int i = 0; i < tools.size(); ++i) {
    const v1::Tool& tool = tools[i];
    if (!required && tool.name() != tool_choice) continue;
    json parameters = json::object({{"type", "object"}});
    if (!tool.parameters().empty()) {
      parameters = json::parse(tool.parameters(), nullptr, /*allow_exceptions=*/false);
      if (!parameters.is_object()) {
        return absl::InvalidArgumentError(
            StrCat("tools[", i, "].function.parameters: not a JSON object"));
      }
    }
    // Key order is the order tojson writes (and the parser reads) them.
    json call = json::object();
    call["type"] = "object";
    call["properties"] = json::object();
    call["properties"]["name"] = json::object({{"const", tool.name()}});
    call["properties"][arguments_key] = std::move(parameters);
    call["required"] = json::array({"name", arguments_key});
    call["additionalProperties"] = false;
    choices.push_back(std::move(call));
  }
  if (choices.empty()) {
    return absl::InvalidArgumentError(
        StrCat("tool_choice: no tool named '", tool_choice, "' among tools"));
  }
  calls.schema =
      choices.size() == 1 ? choices[0].dump() : json::object({{"anyOf", choices}}).dump();
  return calls;
}

}  // namespace tandem::server
