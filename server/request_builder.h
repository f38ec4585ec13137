// Validates a GenerateRequest and turns it into a scheduler Request:
// tokenization or chat templating, sampling defaults, stop conditions.
// Every invalid value is an InvalidArgument status whose message starts with
// the offending field's name.
#ifndef TANDEM_SERVER_REQUEST_BUILDER_H_
#define TANDEM_SERVER_REQUEST_BUILDER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/token_grammar.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/chat_template.h"
#include "scheduler/request.h"
#include "server/tool_call_parser.h"
#include "tandem/v1/generate.pb.h"

namespace tandem::server {

// Server-wide defaults for what a request leaves unset.
struct RequestDefaults {
  int32_t max_tokens = 2048;
  float temperature = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
};

// InvalidArgument naming the --default_* flag that is out of range.
absl::Status ValidateDefaults(const RequestDefaults& defaults);

// A request's latency budget: each field 0 (the daemon's) or positive,
// finite and at most scheduler::MaxLatencyBudget(). InvalidArgument naming
// `field`.ttft_ms or `field`.tpot_ms otherwise.
absl::StatusOr<scheduler::LatencyBudget> LatencyBudgetFromProto(const v1::LatencyBudget& proto,
                                                                std::string_view field);

// Token ids a client sent (a prompt's, stop tokens; Generate's and a
// handoff's) if each is inside the vocabulary of `vocab` tokens, else
// INVALID_ARGUMENT naming the first that is not: "token_ids[2]: token id
// 49152 is outside the vocabulary (49152 tokens)".
absl::StatusOr<std::vector<scheduler::TokenId>> CheckTokenIds(
    const google::protobuf::RepeatedField<uint32_t>& ids, std::string_view field, int32_t vocab);

// The sampling fields of a request, as Generate and a handoff (peer_service)
// accept them: INVALID_ARGUMENT naming the field (`prefix` + its name, or
// "logprobs") for a temperature that is not a finite number >= 0, a
// negative top_k, a top_p outside (0, 1], logprobs outside 0..kMaxLogprobs.
absl::Status ValidateSampling(const step::SamplingParams& sampling, int32_t logprobs,
                              std::string_view prefix);

// A conversation as the chat template takes it: INVALID_ARGUMENT naming
// the field for a tool without a name or with parameters that are not a
// JSON object, or a call's arguments that are not one.
struct Conversation {
  std::vector<tokenizer::ChatMessage> messages;
  std::vector<tokenizer::ChatTool> tools;
};
absl::StatusOr<Conversation> ConversationFromProto(
    const google::protobuf::RepeatedPtrField<v1::ChatMessage>& messages,
    const google::protobuf::RepeatedPtrField<v1::Tool>& tools);

// A conversation (and the tools the model may call) through the chat
// template: INVALID_ARGUMENT naming the field for a tool without a name or
// with parameters that are not a JSON object, a call's arguments that are
// not one, or a conversation the template refuses.
absl::StatusOr<std::vector<tokenizer::TokenId>> EncodeConversation(
    const google::protobuf::RepeatedPtrField<v1::ChatMessage>& messages,
    const google::protobuf::RepeatedPtrField<v1::Tool>& tools,
    const tokenizer::ChatTemplate& chat_template, const tokenizer::BpeTokenizer& tokenizer);

// What the builder needs to know about the model.
struct ModelLimits {
  const tokenizer::BpeTokenizer* tokenizer = nullptr;
  const tokenizer::ChatTemplate* chat_template = nullptr;
  int32_t context_length = 0;
  // Longest prompt accepted (--max_prompt_tokens); 0: context_length - 1.
  int32_t max_prompt_tokens = 0;
  // Structured output's grammars (response_format, forced tool calls);
  // null: refused.
  const grammar::GrammarVocabulary* grammar = nullptr;
  // The tool-call syntax the chat template teaches.
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
};

inline constexpr int kMaxStopStrings = 16;
inline constexpr int kMaxStopStringBytes = 256;
inline constexpr int kMaxStopTokenIds = 64;
inline constexpr int kMaxCacheSaltBytes = 256;
inline constexpr int kMaxWorkloadBytes = 128;
inline constexpr size_t kMaxJsonSchemaBytes = 64 * 1024;
inline constexpr int kMaxLogprobs = 20;

struct BuiltRequest {
  scheduler::Request request;  // without sink and deadline
  std::vector<std::string> stop_strings;
  // The request brought tools and lets the model call them: its answer's
  // calls are parsed out (tool_call_parser.h).
  bool parse_tool_calls = false;
  // The rendered prompt ends inside an opened <think> (the answer starts
  // with reasoning).
  bool starts_in_reasoning = false;
};

// `random_seed` is used when the request sets no seed.
absl::StatusOr<BuiltRequest> BuildRequest(const v1::GenerateRequest& proto,
                                          const ModelLimits& model, const RequestDefaults& defaults,
                                          uint64_t random_seed);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_REQUEST_BUILDER_H_
