// The OpenAI HTTP API's JSON, translated to and from Tandem's own request and
// response messages, so that HTTP and gRPC share one validation and one
// scheduler path (openai_service.h serves it over HTTP).
//
// Requests: the body of POST /v1/chat/completions or /v1/completions becomes
// a v1::GenerateRequest; a field Tandem cannot honour is an ApiError naming
// it, never silently ignored (n > 1, penalties, logit_bias, echo, suffix).
// Fields that change nothing here (user, metadata, store) are accepted.
// Unknown fields are ignored, as OpenAI's own server and vLLM do.
//
// Responses: one formatter per request turns the GenerateResponse messages
// into chat.completion / text_completion objects, or into the chunks of a
// server-sent-event stream.
#ifndef TANDEM_SERVER_OPENAI_PROTOCOL_H_
#define TANDEM_SERVER_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "absl/status/status.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "tandem/v1/generate.pb.h"

namespace tandem::server::openai {

// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};

// The JSON body of an error.
std::string ErrorBody(const ApiError& error);
// A Tandem status as the HTTP API reports it: INVALID_ARGUMENT 400 naming
// the parameter (the OpenAI name of the field the message starts with),
// UNAUTHENTICATED 401, NOT_FOUND 404, RESOURCE_EXHAUSTED 429, UNAVAILABLE
// 503, DEADLINE_EXCEEDED 504, the rest 500. `chat`: a prompt error names
// `messages` rather than `prompt`.
ApiError FromStatus(const absl::Status& status, bool chat);

enum class Endpoint { kChatCompletions, kCompletions };

// What a request asks of the response, beyond the GenerateRequest.
struct ParsedRequest {
  v1::GenerateRequest generate;
  Endpoint endpoint = Endpoint::kChatCompletions;
  std::string model;  // as the client named it
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Log-probabilities: none, or the chosen token's with `top_logprobs`
  // alternatives (the GenerateRequest asks for at least one: its logprobs
  // field counts alternatives and 0 means none).
  bool logprobs = false;
  int32_t top_logprobs = 0;
  // Extension (vLLM's name): each choice also carries "token_ids", the ids
  // of the tokens it adds (benchmarks count and replay them).
  bool return_token_ids = false;
};

// Parses a request body. `endpoint` says which shape it must have.
std::variant<ParsedRequest, ApiError> ParseRequest(std::string_view body, Endpoint endpoint);

// Formats one request's response. Not thread-safe: one formatter per
// request, fed in order.
class ResponseFormatter {
 public:
  // `id`: the response id ("chatcmpl-..." or "cmpl-..."); `created`: Unix
  // seconds; `model`: the name the response reports.
  ResponseFormatter(const ParsedRequest& request, std::string id, int64_t created,
                    std::string model, const tokenizer::BpeTokenizer& tokenizer);

  // Streaming: the SSE events for `message` ("data: {...}\n\n" each; the
  // first call opens the assistant's turn on chat). Empty when the message
  // carries nothing a client sees (a token whose text is held back, without
  // logprobs).
  std::string StreamEvents(const v1::GenerateResponse& message);
  // Streaming: the events that end a stream after the final message
  // (the usage chunk when asked for, then "data: [DONE]").
  std::string StreamEnd();
  // Streaming: an error event mid-stream, then "data: [DONE]".
  static std::string StreamError(const ApiError& error);

  // Not streaming: the whole response for the merged messages.
  std::string Whole(const v1::GenerateResponse& merged);

 private:
  const Endpoint endpoint_;
  const bool include_usage_;
  const bool logprobs_;
  const int32_t top_logprobs_;
  const bool return_token_ids_;
  const std::string id_;
  const int64_t created_;
  const std::string model_;
  const tokenizer::BpeTokenizer& tokenizer_;
  bool role_sent_ = false;
  int tool_calls_sent_ = 0;  // the index of the next streamed call
  int64_t text_offset_ = 0;  // completions' logprobs.text_offset
  std::optional<v1::Usage> usage_;
};

// GET /v1/models: the served model, by each name it answers to.
std::string ModelsBody(std::string_view served_name, int64_t created);
// GET /v1/models/{id}: the served model as an object of its own.
std::string ModelBody(std::string_view served_name, int64_t created);

}  // namespace tandem::server::openai

#endif  // TANDEM_SERVER_OPENAI_PROTOCOL_H_
