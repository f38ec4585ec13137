// The OpenAI request and response JSON (server/openai_protocol.h), checked
// field by field against the shapes OpenAI documents: what reaches the
// GenerateRequest, each refusal naming its parameter, the status mapping,
// and the exact chunks of a stream. The tokenizer is the random SmolLM2
// model's (one token per byte), so a token's text is its byte.
#include "server/openai_protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/model/random_model.h"
#include "nlohmann/json.hpp"

namespace tandem::server::openai {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

ParsedRequest Parsed(const std::string& body, Endpoint endpoint = Endpoint::kChatCompletions) {
  std::variant<ParsedRequest, ApiError> r = ParseRequest(body, endpoint);
  if (const ApiError* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "refused: " << e->message;
    return {};
  }
  return std::get<ParsedRequest>(std::move(r));
}

ApiError Refused(const std::string& body, Endpoint endpoint = Endpoint::kChatCompletions) {
  std::variant<ParsedRequest, ApiError> r = ParseRequest(body, endpoint);
  if (!std::holds_alternative<ApiError>(r)) {
    ADD_FAILURE() << "accepted: " << body;
    return {};
  }
  return std::get<ApiError>(std::move(r));
}

TEST(OpenAiRequestTest, ChatFieldsReachTheGenerateRequest) {
  const ParsedRequest r = Parsed(R"({
    "model": "m", "stream": true, "stream_options": {"include_usage": true},
    "messages": [{"role": "developer", "content": "Be brief."},
                 {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                              {"type": "text", "text": "there"}]},
                 {"role": "assistant", "content": null}],
    "temperature": 0.5, "top_p": 0.9, "top_k": -1, "seed": 7,
    "max_tokens": 10, "max_completion_tokens": 20, "stop": "END",
    "logprobs": true, "top_logprobs": 0, "n": 1, "user": "u1",
    "cache_salt": "s", "workload": "chat", "expected_output_tokens": 30,
    "latency_budget": {"ttft_ms": 500, "tpot_ms": 50}, "ignore_eos": true,
    "unknown_field": {"ignored": true}})");
  EXPECT_EQ(r.model, "m");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  ASSERT_EQ(r.generate.messages_size(), 3);
  EXPECT_EQ(r.generate.messages(0).role(), "system");  // developer is system
  EXPECT_EQ(r.generate.messages(1).content(), "Hi there");
  EXPECT_EQ(r.generate.messages(2).content(), "");
  EXPECT_FLOAT_EQ(r.generate.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(r.generate.sampling().top_p(), 0.9f);
  EXPECT_EQ(r.generate.sampling().top_k(), 0);  // -1 is off
  EXPECT_EQ(r.generate.sampling().seed(), 7u);
  EXPECT_EQ(r.generate.max_tokens(), 20);  // max_completion_tokens wins
  EXPECT_THAT(r.generate.stop(), ::testing::ElementsAre("END"));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  EXPECT_EQ(r.generate.logprobs(), 1);  // the chosen token's comes with one alternative
  EXPECT_EQ(r.generate.cache_salt(), "s");
  EXPECT_EQ(r.generate.workload(), "chat");
  EXPECT_EQ(r.generate.expected_output_tokens(), 30);
  EXPECT_DOUBLE_EQ(r.generate.latency_budget().ttft_ms(), 500);
  EXPECT_DOUBLE_EQ(r.generate.latency_budget().tpot_ms(), 50);
  EXPECT_TRUE(r.generate.ignore_eos());
}

TEST(OpenAiRequestTest, UnsetFieldsStayUnsetForTheDaemonDefaults) {
  const ParsedRequest r = Parsed(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                     "temperature": null, "stop": null})");
  EXPECT_FALSE(r.generate.sampling().has_temperature());
  EXPECT_FALSE(r.generate.sampling().has_top_p());
  EXPECT_FALSE(r.generate.has_max_tokens());
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.generate.logprobs(), 0);
}

TEST(OpenAiRequestTest, CompletionsTakeTextOrTokenIdsOrAListOfOne) {
  EXPECT_EQ(Parsed(R"({"model": "m", "prompt": "Once"})", Endpoint::kCompletions).generate.prompt(),
            "Once");
  EXPECT_EQ(
      Parsed(R"({"model": "m", "prompt": ["Once"]})", Endpoint::kCompletions).generate.prompt(),
      "Once");
  EXPECT_THAT(
      Parsed(R"({"model": "m", "prompt": [1, 2, 3]})", Endpoint::kCompletions).generate.token_ids(),
      ::testing::ElementsAre(1u, 2u, 3u));
  EXPECT_THAT(
      Parsed(R"({"model": "m", "prompt": [[4, 5]]})", Endpoint::kCompletions).generate.token_ids(),
      ::testing::ElementsAre(4u, 5u));
  const ParsedRequest lp =
      Parsed(R"({"model": "m", "prompt": "x", "logprobs": 3})", Endpoint::kCompletions);
  EXPECT_TRUE(lp.logprobs);
  EXPECT_EQ(lp.top_logprobs, 3);
  EXPECT_EQ(lp.generate.logprobs(), 3);
}

TEST(OpenAiRequestTest, EachRefusalNamesItsParameter) {
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  struct Case {
    std::string body;
    std::string param;
    Endpoint endpoint = Endpoint::kChatCompletions;
  };
  const std::vector<Case> cases = {
      {"{", "body"},
      {"[1]", "body"},
      {"{" + user + "}", "model"},
      {R"({"model": 5, )" + user + "}", "model"},
      {R"({"model": "m"})", "messages"},
      {R"({"model": "m", "messages": []})", "messages"},
      {R"({"model": "m", "messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"model": "m", "messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0].type"},
      {R"({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "1"}]}]})",
       "messages[0].tool_calls[0].function"},
      {R"({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function":
          {"name": "f", "arguments": [1]}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"model": "m", "n": 3, )" + user + "}", "n"},
      {R"({"model": "m", "temperature": "hot", )" + user + "}", "temperature"},
      {R"({"model": "m", "max_tokens": 0, )" + user + "}", "max_tokens"},
      {R"({"model": "m", "max_tokens": 1.5, )" + user + "}", "max_tokens"},
      {R"({"model": "m", "stop": [1], )" + user + "}", "stop"},
      {R"({"model": "m", "frequency_penalty": 1, )" + user + "}", "frequency_penalty"},
      {R"({"model": "m", "logit_bias": {"1": 2}, )" + user + "}", "logit_bias"},
      {R"({"model": "m", "tools": [{"type": "function"}], )" + user + "}", "tools[0].function"},
      {R"({"model": "m", "tools": [{"type": "retrieval"}], )" + user + "}", "tools[0].type"},
      {R"({"model": "m", "tools": [{"function": {"name": "f", "parameters": 3}}], )" + user + "}",
       "tools[0].function.parameters"},
      {R"({"model": "m", "tool_choice": "always", )" + user + "}", "tool_choice"},
      {R"({"model": "m", "tool_choice": {"type": "function"}, )" + user + "}", "tool_choice"},
      {R"({"model": "m", "tool_choice": {"function": {"name": "auto"}}, )" + user + "}",
       "tool_choice.function.name"},
      {R"({"model": "m", "parallel_tool_calls": "yes", )" + user + "}", "parallel_tool_calls"},
      {R"({"model": "m", "response_format": {"type": "xml"}, )" + user + "}",
       "response_format.type"},
      {R"({"model": "m", "response_format": {"type": "json_schema"}, )" + user + "}",
       "response_format.json_schema"},
      {R"({"model": "m", "response_format": {"type": "json_schema", "json_schema": {"schema": 1}},
          )" +
           user + "}",
       "response_format.json_schema.schema"},
      {R"({"model": "m", "top_logprobs": 2, )" + user + "}", "top_logprobs"},
      {R"({"model": "m", "logprobs": true, "top_logprobs": 21, )" + user + "}", "top_logprobs"},
      {R"({"model": "m", "stream_options": {"include_usage": true}, )" + user + "}",
       "stream_options"},
      {R"({"model": "m", "latency_budget": {"ttft_ms": "1"}, )" + user + "}",
       "latency_budget.ttft_ms"},
      {R"({"model": "m", "prompt": ["a", "b"]})", "prompt", Endpoint::kCompletions},
      {R"({"model": "m", "prompt": [-1]})", "prompt", Endpoint::kCompletions},
      {R"({"model": "m", "prompt": ""})", "prompt", Endpoint::kCompletions},
      {R"({"model": "m", "prompt": "x", "echo": true})", "echo", Endpoint::kCompletions},
      {R"({"model": "m", "prompt": "x", "suffix": "y"})", "suffix", Endpoint::kCompletions},
      {R"({"model": "m", "prompt": "x", "best_of": 2})", "best_of", Endpoint::kCompletions},
  };
  for (const Case& c : cases) {
    const ApiError e = Refused(c.body, c.endpoint);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_EQ(e.message.rfind(c.param + ": ", 0), 0u) << e.message;
    // Every refusal is an OpenAI error object.
    const json body = json::parse(ErrorBody(e));
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    EXPECT_EQ(body["error"]["param"], c.param);
  }
}

TEST(OpenAiRequestTest, ToolsAndToolTurnsReachTheGenerateRequest) {
  const ParsedRequest r = Parsed(R"({"model": "m", "tool_choice": "auto",
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}}],
    "messages": [{"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": null, "reasoning_content": "Use the tool.",
                  "tool_calls": [{"id": "call_1", "type": "function",
                                  "function": {"name": "get_weather",
                                               "arguments": "{\"city\": \"Paris\"}"}}]},
                 {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
                  "content": "18 C"}]})");
  ASSERT_EQ(r.generate.tools_size(), 1);
  EXPECT_EQ(r.generate.tools(0).name(), "get_weather");
  EXPECT_EQ(r.generate.tools(0).description(), "Weather.");
  // The schema keeps the client's key order (the template prints it).
  EXPECT_EQ(r.generate.tools(0).parameters(),
            R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})");
  EXPECT_EQ(r.generate.tool_choice(), "auto");
  ASSERT_EQ(r.generate.messages_size(), 3);
  const v1::ChatMessage& call = r.generate.messages(1);
  EXPECT_EQ(call.reasoning_content(), "Use the tool.");
  ASSERT_EQ(call.tool_calls_size(), 1);
  EXPECT_EQ(call.tool_calls(0).id(), "call_1");
  EXPECT_EQ(call.tool_calls(0).arguments(), R"({"city": "Paris"})");
  EXPECT_EQ(r.generate.messages(2).tool_call_id(), "call_1");
  EXPECT_EQ(r.generate.messages(2).name(), "get_weather");
  EXPECT_EQ(r.generate.messages(2).content(), "18 C");
  EXPECT_FALSE(r.generate.has_parallel_tool_calls());
  // Forcing a call: "required", or a named function (the gRPC field takes
  // the name); parallel_tool_calls as given.
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(
      Parsed(R"({"model": "m", "tool_choice": "required", )" + user + "}").generate.tool_choice(),
      "required");
  const ParsedRequest named = Parsed(
      R"({"model": "m", "parallel_tool_calls": false, "tool_choice": {"type": "function",
          "function": {"name": "get_weather"}}, )" +
      user + "}");
  EXPECT_EQ(named.generate.tool_choice(), "get_weather");
  ASSERT_TRUE(named.generate.has_parallel_tool_calls());
  EXPECT_FALSE(named.generate.parallel_tool_calls());
}

TEST(OpenAiRequestTest, ResponseFormatsReachTheGenerateRequest) {
  const std::string user = R"("messages": [{"role": "user", "content": "Hi"}])";
  const ParsedRequest schema = Parsed(R"({"model": "m", "response_format": {"type": "json_schema",
    "json_schema": {"name": "p", "strict": true, "schema": {"type": "object",
                    "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}}}, )" +
                                      user + "}");
  EXPECT_EQ(schema.generate.response_format().type(), "json_schema");
  EXPECT_TRUE(schema.generate.response_format().strict());
  // The schema keeps the client's key order (properties come out in it).
  EXPECT_EQ(schema.generate.response_format().json_schema(),
            R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}})");
  const ParsedRequest object =
      Parsed(R"({"model": "m", "response_format": {"type": "json_object"}, )" + user + "}");
  EXPECT_EQ(object.generate.response_format().type(), "json_object");
  EXPECT_FALSE(object.generate.response_format().strict());
  EXPECT_FALSE(Parsed(R"({"model": "m", )" + user + "}").generate.has_response_format());
}

TEST(OpenAiErrorTest, StatusesMapToTheHttpCodesClientsRetryOn) {
  struct Case {
    absl::Status status;
    int http;
    std::string param;
  };
  const std::vector<Case> cases = {
      {absl::InvalidArgumentError("sampling.temperature: must be >= 0"), 400, "temperature"},
      {absl::InvalidArgumentError("prompt: the text produces no tokens"), 400, "messages"},
      {absl::InvalidArgumentError("messages[2]: unknown role 'x'"), 400, "messages[2]"},
      {absl::InvalidArgumentError("the prompt is too long"), 400, ""},
      {absl::UnauthenticatedError("invalid API key"), 401, ""},
      {absl::ResourceExhaustedError("the request queue is full"), 429, ""},
      {absl::UnavailableError("the server is draining"), 503, ""},
      {absl::DeadlineExceededError("deadline"), 504, ""},
      {absl::InternalError("injected fault"), 500, ""},
  };
  for (const Case& c : cases) {
    const ApiError e = FromStatus(c.status, /*chat=*/true);
    EXPECT_EQ(e.http_status, c.http) << c.status;
    EXPECT_EQ(e.param, c.param) << c.status;
    EXPECT_EQ(e.message, std::string(c.status.message()));
  }
  EXPECT_EQ(FromStatus(absl::InvalidArgumentError("prompt: x"), /*chat=*/false).param, "prompt");
}

class OpenAiResponseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<model::GgufFile>> file =
        model::OpenRandomModel("random:smollm2-135m");
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = *std::move(file);
    absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tok =
        tokenizer::BpeTokenizer::FromGguf(*file_);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
  }

  // A token message as ResponseStream sends it: the byte-token of `c`.
  v1::GenerateResponse Token(char c, float logprob = -0.5f) const {
    const std::vector<tokenizer::TokenId> ids =
        tokenizer_->Encode(std::string(1, c), /*parse_special=*/false);
    v1::GenerateResponse m;
    m.set_request_id("r1");
    m.set_text(std::string(1, c));
    m.add_token_ids(static_cast<uint32_t>(ids.at(0)));
    v1::TokenLogprobs* lp = m.add_logprobs();
    lp->set_token_id(static_cast<uint32_t>(ids.at(0)));
    lp->set_logprob(logprob);
    for (char alt : {c, 'z'}) {
      v1::TopLogprob* top = lp->add_top();
      top->set_token_id(static_cast<uint32_t>(
          tokenizer_->Encode(std::string(1, alt), /*parse_special=*/false).at(0)));
      top->set_logprob(alt == c ? logprob : -3.0f);
    }
    return m;
  }

  static v1::GenerateResponse Final(v1::FinishReason reason) {
    v1::GenerateResponse m;
    m.set_finish_reason(reason);
    m.mutable_usage()->set_prompt_tokens(7);
    m.mutable_usage()->set_completion_tokens(2);
    m.mutable_usage()->set_cached_prompt_tokens(4);
    return m;
  }

  // The JSON of each "data:" event (the literal text of [DONE]).
  static std::vector<json> Events(const std::string& sse) {
    std::vector<json> out;
    size_t at = 0;
    while ((at = sse.find("data: ", at)) != std::string::npos) {
      const size_t end = sse.find("\n\n", at);
      const std::string data = sse.substr(at + 6, end - at - 6);
      out.push_back(data == "[DONE]" ? json("[DONE]") : json::parse(data));
      at = end + 2;
    }
    return out;
  }

  std::unique_ptr<model::GgufFile> file_;
  std::unique_ptr<tokenizer::BpeTokenizer> tokenizer_;
};

TEST_F(OpenAiResponseTest, AChatStreamHasRoleContentFinishUsageAndDone) {
  ParsedRequest request;
  request.endpoint = Endpoint::kChatCompletions;
  request.stream = request.include_usage = true;
  ResponseFormatter f(request, "chatcmpl-1", 1700000000, "m", *tokenizer_);
  std::string sse = f.StreamEvents(Token('H'));
  sse += f.StreamEvents(Token('i'));
  sse += f.StreamEvents(Final(v1::FINISH_REASON_STOP));
  sse += f.StreamEnd();
  const std::vector<json> events = Events(sse);
  ASSERT_EQ(events.size(), 6u) << sse;
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(events[i]["id"], "chatcmpl-1");
    EXPECT_EQ(events[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(events[i]["created"], 1700000000);
    EXPECT_EQ(events[i]["model"], "m");
  }
  EXPECT_EQ(events[0]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(events[1]["choices"][0]["delta"]["content"], "H");
  EXPECT_EQ(events[2]["choices"][0]["delta"]["content"], "i");
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(events[i]["choices"][0]["finish_reason"].is_null());
    EXPECT_TRUE(events[i]["usage"].is_null());
    EXPECT_TRUE(events[i]["choices"][0]["logprobs"].is_null());  // not asked for
  }
  EXPECT_EQ(events[3]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(events[3]["choices"][0]["delta"], json::object());
  EXPECT_EQ(events[4]["choices"], json::array());
  EXPECT_EQ(events[4]["usage"], json::parse(R"({"prompt_tokens": 7, "completion_tokens": 2,
      "total_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}})"));
  EXPECT_EQ(events[5], "[DONE]");
}

TEST_F(OpenAiResponseTest, ChatLogprobsCarryTokenBytesAndAlternatives) {
  ParsedRequest request;
  request.logprobs = true;
  request.top_logprobs = 1;
  ResponseFormatter f(request, "chatcmpl-1", 1, "m", *tokenizer_);
  v1::GenerateResponse merged = Token('A', -0.25f);
  merged.MergeFrom(Final(v1::FINISH_REASON_LENGTH));
  const json body = json::parse(f.Whole(merged));
  EXPECT_EQ(body["object"], "chat.completion");
  const json& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(choice["message"], json({{"role", "assistant"}, {"content", "A"}}));
  const json& entry = choice["logprobs"]["content"][0];
  EXPECT_EQ(entry["token"], "A");
  EXPECT_FLOAT_EQ(entry["logprob"].get<float>(), -0.25f);
  EXPECT_EQ(entry["bytes"], json::array({65}));
  ASSERT_EQ(entry["top_logprobs"].size(), 1u);  // two came, one was asked for
  EXPECT_EQ(entry["top_logprobs"][0]["token"], "A");
}

TEST_F(OpenAiResponseTest, CompletionLogprobsHaveOffsetsIntoTheText) {
  ParsedRequest request;
  request.endpoint = Endpoint::kCompletions;
  request.stream = true;
  request.logprobs = true;
  request.top_logprobs = 2;
  ResponseFormatter f(request, "cmpl-1", 1, "m", *tokenizer_);
  const std::vector<json> first = Events(f.StreamEvents(Token('a')));
  const std::vector<json> second = Events(f.StreamEvents(Token('b')));
  ASSERT_EQ(first.size(), 1u);  // completions have no role chunk
  EXPECT_EQ(first[0]["object"], "text_completion");
  EXPECT_EQ(first[0]["choices"][0]["text"], "a");
  EXPECT_EQ(first[0]["choices"][0]["logprobs"]["text_offset"], json::array({0}));
  EXPECT_EQ(second[0]["choices"][0]["logprobs"]["text_offset"], json::array({1}));
  EXPECT_EQ(second[0]["choices"][0]["logprobs"]["tokens"], json::array({"b"}));
  EXPECT_EQ(second[0]["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);
  EXPECT_FALSE(second[0].contains("usage"));  // include_usage was not asked for
}

TEST_F(OpenAiResponseTest, ToolCallsAndReasoningInChunksAndWhole) {
  ParsedRequest request;
  request.stream = true;
  ResponseFormatter f(request, "chatcmpl-1", 1, "m", *tokenizer_);
  v1::GenerateResponse thought;
  thought.set_reasoning("Use the tool.");
  v1::GenerateResponse call;
  v1::ToolCall* c = call.add_tool_calls();
  c->set_id("call_abc");
  c->set_name("get_weather");
  c->set_arguments(R"({"city":"Paris"})");
  std::string sse = f.StreamEvents(thought);
  sse += f.StreamEvents(call);
  sse += f.StreamEvents(Final(v1::FINISH_REASON_STOP));
  const std::vector<json> events = Events(sse);
  ASSERT_EQ(events.size(), 4u) << sse;  // role, reasoning, call, finish
  EXPECT_EQ(events[1]["choices"][0]["delta"], json({{"reasoning_content", "Use the tool."}}));
  EXPECT_EQ(events[2]["choices"][0]["delta"]["tool_calls"],
            json::parse(R"([{"index": 0, "id": "call_abc", "type": "function",
                             "function": {"name": "get_weather",
                                          "arguments": "{\"city\":\"Paris\"}"}}])"));
  EXPECT_EQ(events[3]["choices"][0]["finish_reason"], "tool_calls");

  ParsedRequest whole_request;
  ResponseFormatter w(whole_request, "chatcmpl-2", 1, "m", *tokenizer_);
  v1::GenerateResponse merged = call;
  merged.set_reasoning("Use the tool.");
  merged.MergeFrom(Final(v1::FINISH_REASON_STOP));
  const json body = json::parse(w.Whole(merged));
  const json& message = body["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  EXPECT_EQ(message["reasoning_content"], "Use the tool.");
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
}

TEST_F(OpenAiResponseTest, AnErrorMidStreamIsAnErrorEventThenDone) {
  const std::vector<json> events = Events(ResponseFormatter::StreamError(
      FromStatus(absl::InternalError("the worker failed"), /*chat=*/true)));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["error"]["message"], "the worker failed");
  EXPECT_EQ(events[0]["error"]["type"], "server_error");
  EXPECT_EQ(events[1], "[DONE]");
}

TEST(OpenAiModelsTest, TheListHasTheServedModel) {
  const json body = json::parse(ModelsBody("SmolLM2", 5));
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["data"], json::parse(R"([{"id": "SmolLM2", "object": "model", "created": 5,
                             "owned_by": "tandem"}])"));
}

TEST(OpenAiModelsTest, OneModelIsTheListsEntryAsAnObject) {
  EXPECT_EQ(json::parse(ModelBody("SmolLM2", 5)),
            json::parse(R"({"id": "SmolLM2", "object": "model", "created": 5,
                            "owned_by": "tandem"})"));
}

}  // namespace
}  // namespace tandem::server::openai
