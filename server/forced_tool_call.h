// Forcing a tool call (tool_choice "required" or a tool's name): the answer
// is constrained to calls written exactly as the chat template teaches the
// model to write them, so the tool-call parser (tool_call_parser.h) always
// finds at least one, to a tool the request offers, with arguments that
// meet that tool's parameter schema.
#ifndef TANDEM_SERVER_FORCED_TOOL_CALL_H_
#define TANDEM_SERVER_FORCED_TOOL_CALL_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/grammar/token_grammar.h"
#include "server/tool_call_parser.h"
#include "tandem/v1/generate.pb.h"

namespace tandem::server {

// The answer's grammar, in the form `format` writes calls:
//   kHermes  one or more (one when !parallel) `<tool_call>\n{json}\n</tool_call>`
//            joined by newlines
//   kLlama3  the whole answer is one {"name": ..., "parameters": {...}}
// Each call names one of the allowed tools (every tool for "required", the
// named one otherwise) and its arguments meet that tool's parameters (any
// object when it has none); JSON is written as tojson writes it.
// INVALID_ARGUMENT naming tool_choice for a name no tool has, or a format
// that cannot be forced (kNone; kMistral, whose [TOOL_CALLS] marker is a
// control token that constrained output never holds), and naming
// tools[i].function.parameters for parameters that are not a JSON object.
absl::StatusOr<grammar::GrammarVocabulary::TaggedJson> ForcedToolCalls(
    ToolCallFormat format, const google::protobuf::RepeatedPtrField<v1::Tool>& tools,
    std::string_view tool_choice, bool parallel);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_FORCED_TOOL_CALL_H_
