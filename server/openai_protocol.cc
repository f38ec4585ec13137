#include "server/openai_protocol.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/strings.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "nlohmann/json.hpp"

namespace tandem::server::openai {
namespace {

// Ordered: objects keep their keys in the order given (a tool's schema
// reaches the chat template as the client wrote it) and responses list
// theirs in OpenAI's order.
using json = nlohmann::ordered_json;

ApiError Invalid(std::string param, std::string message) {
  ApiError error;
  error.message = StrCat(param, ": ", message);
  error.param = std::move(param);
  return error;
}

ApiError Unsupported(std::string param, std::string_view what) {
  ApiError error = Invalid(std::move(param), StrCat(what, " is not supported by this server"));
  error.code = "unsupported_parameter";
  return error;
}

// Reads one optional field of `body`, checking its JSON type; a null counts
// as absent (the OpenAI SDKs send null for unset fields).
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}

  const json* Get(const char* name) const {
    auto it = body_.find(name);
    if (it == body_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<ApiError> Bool(const char* name, bool* out) const {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return Invalid(name, "must be a boolean");
    *out = v->get<bool>();
    return std::nullopt;
  }
  std::optional<ApiError> Number(const char* name, std::optional<double>* out) const {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return Invalid(name, "must be a number");
    *out = v->get<double>();
    return std::nullopt;
  }
  std::optional<ApiError> Integer(const char* name, std::optional<int64_t>* out) const {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_integer()) {
      *out = v->get<int64_t>();
      return std::nullopt;
    }
    // 12.0 is an integer too (some clients send every number as a double).
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9.0e15) {
        *out = static_cast<int64_t>(d);
        return std::nullopt;
      }
    }
    return Invalid(name, "must be an integer");
  }
  std::optional<ApiError> String(const char* name, std::optional<std::string>* out) const {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return Invalid(name, "must be a string");
    *out = v->get<std::string>();
    return std::nullopt;
  }

 private:
  const json& body_;
};

#define TANDEM_RETURN_IF_ERROR(expr)                                                \
  do {                                                                              \
    if (std::optional<ApiError> e_ = (expr); e_.has_value()) return *std::move(e_); \
  } while (false)

int32_t ClampToInt32(int64_t v) {
  return static_cast<int32_t>(std::clamp<int64_t>(v, std::numeric_limits<int32_t>::min(),
                                                  std::numeric_limits<int32_t>::max()));
}

// A message's content: a string, or a list of text parts (joined).
std::optional<ApiError> MessageContent(const json& message, const std::string& where,
                                       std::string* out) {
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    *out = it->get<std::string>();
    return std::nullopt;
  }
  if (!it->is_array()) return Invalid(where + ".content", "must be a string or a list of parts");
  for (size_t j = 0; j < it->size(); ++j) {
    const json& part = (*it)[j];
    const std::string part_where = StrCat(where, ".content[", j, "]");
    if (!part.is_object()) return Invalid(part_where, "must be an object");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) {
      return Invalid(part_where + ".type", "must be a string");
    }
    if (*type != "text") {
      return Unsupported(part_where + ".type",
                         StrCat("content of type \"", type->get<std::string>(), "\""));
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      return Invalid(part_where + ".text", "must be a string");
    }
    out->append(text->get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> ParseMessages(const Fields& fields, v1::GenerateRequest& out) {
  const json* messages = fields.Get("messages");
  if (messages == nullptr) return Invalid("messages", "is required");
  if (!messages->is_array()) return Invalid("messages", "must be a list of messages");
  if (messages->empty()) return Invalid("messages", "must not be empty");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = StrCat("messages[", i, "]");
    if (!m.is_object()) return Invalid(where, "must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return Invalid(where + ".role", "must be a string");
    v1::ChatMessage* message = out.add_messages();
    // "developer" is the newer OpenAI name of the system role.
    message->set_role(*role == "developer" ? std::string("system") : role->get<std::string>());
    if (std::optional<ApiError> e = MessageContent(m, where, message->mutable_content())) return e;
    const Fields fields(m);
    std::optional<std::string> text;
    TANDEM_RETURN_IF_ERROR(fields.String("tool_call_id", &text));
    if (text) message->set_tool_call_id(*text);
    text.reset();
    TANDEM_RETURN_IF_ERROR(fields.String("name", &text));
    if (text) message->set_name(*text);
    text.reset();
    TANDEM_RETURN_IF_ERROR(fields.String("reasoning_content", &text));
    if (text) message->set_reasoning_content(*text);
    if (const json* calls = fields.Get("tool_calls"); calls != nullptr) {
      if (!calls->is_array()) return Invalid(where + ".tool_calls", "must be a list");
      for (size_t j = 0; j < calls->size(); ++j) {
        const std::string call_where = StrCat(where, ".tool_calls[", j, "]");
        const json& call = (*calls)[j];
        auto function = call.is_object() ? call.find("function") : call.end();
        if (!call.is_object() || function == call.end() || !function->is_object()) {
          return Invalid(call_where + ".function", "must be an object");
        }
        auto name = function->find("name");
        if (name == function->end() || !name->is_string()) {
          return Invalid(call_where + ".function.name", "must be a string");
        }
        v1::ToolCall* out_call = message->add_tool_calls();
        out_call->set_name(name->get<std::string>());
        if (auto id = call.find("id"); id != call.end() && id->is_string()) {
          out_call->set_id(id->get<std::string>());
        }
        // OpenAI sends the arguments as a JSON string; a parsed object is
        // taken too.
        auto arguments = function->find("arguments");
        if (arguments == function->end() || arguments->is_null()) {
          out_call->set_arguments("{}");
        } else if (arguments->is_string()) {
          out_call->set_arguments(arguments->get<std::string>());
        } else if (arguments->is_object()) {
          out_call->set_arguments(arguments->dump());
        } else {
          return Invalid(call_where + ".function.arguments", "must be a JSON object's text");
        }
      }
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ParsePrompt(const Fields& fields, v1::GenerateRequest& out) {
  const json* prompt = fields.Get("prompt");
  if (prompt == nullptr) return Invalid("prompt", "is required");
  // A list of one prompt (string or token ids) is one prompt; more is a batch.
  const json* one = prompt;
  if (prompt->is_array() && !prompt->empty() &&
      (prompt->front().is_string() || prompt->front().is_array())) {
    if (prompt->size() != 1) {
      return Unsupported("prompt", "more than one prompt per request (send one request each)");
    }
    one = &prompt->front();
  }
  if (one->is_string()) {
    out.set_prompt(one->get<std::string>());
    if (out.prompt().empty()) return Invalid("prompt", "must not be empty");
    return std::nullopt;
  }
  if (!one->is_array()) return Invalid("prompt", "must be a string or a list of token ids");
  if (one->empty()) return Invalid("prompt", "must not be empty");
  for (const json& id : *one) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<uint32_t>::max()) {
      return Invalid("prompt", "token ids must be integers >= 0");
    }
    out.add_token_ids(static_cast<uint32_t>(id.get<int64_t>()));
  }
  return std::nullopt;
}

std::optional<ApiError> ParseTools(const Fields& fields, v1::GenerateRequest& out) {
  if (const json* tools = fields.Get("tools"); tools != nullptr) {
    if (!tools->is_array()) return Invalid("tools", "must be a list of tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string where = StrCat("tools[", i, "]");
      const json& tool = (*tools)[i];
      if (!tool.is_object() || tool.value("type", std::string("function")) != "function") {
        return Invalid(where + ".type", "only function tools are supported");
      }
      auto function = tool.find("function");
      if (function == tool.end() || !function->is_object()) {
        return Invalid(where + ".function", "must be an object");
      }
      auto name = function->find("name");
      if (name == function->end() || !name->is_string()) {
        return Invalid(where + ".function.name", "must be a string");
      }
      v1::Tool* t = out.add_tools();
      t->set_name(name->get<std::string>());
      if (auto d = function->find("description"); d != function->end() && d->is_string()) {
        t->set_description(d->get<std::string>());
      }
      if (auto p = function->find("parameters"); p != function->end() && !p->is_null()) {
        if (!p->is_object()) return Invalid(where + ".function.parameters", "must be an object");
        t->set_parameters(p->dump());
      }
    }
  }
  // tool_choice: "none", "auto", "required", or {"type": "function",
  // "function": {"name": ...}} (the gRPC field takes the name).
  if (const json* choice = fields.Get("tool_choice"); choice != nullptr && !choice->is_null()) {
    if (choice->is_string()) {
      const std::string value = choice->get<std::string>();
      if (value != "none" && value != "auto" && value != "required") {
        return Invalid("tool_choice", "must be none, auto, required or a named function");
      }
      out.set_tool_choice(value);
    } else {
      auto function = choice->is_object() ? choice->find("function") : choice->end();
      if (!choice->is_object() || function == choice->end() || !function->is_object() ||
          !function->contains("name") || !(*function)["name"].is_string()) {
        return Invalid("tool_choice",
                       R"(must be none, auto, required or {"type": "function", "function": )"
                       R"({"name": ...}})");
      }
      const std::string name = (*function)["name"].get<std::string>();
      if (name == "none" || name == "auto" || name == "required") {
        return Invalid("tool_choice.function.name",
                       StrCat("a tool named '", name, "' cannot be forced by name"));
      }
      out.set_tool_choice(name);
    }
  }
  if (fields.Get("parallel_tool_calls") != nullptr) {
    bool parallel = true;
    TANDEM_RETURN_IF_ERROR(fields.Bool("parallel_tool_calls", &parallel));
    out.set_parallel_tool_calls(parallel);
  }
  return std::nullopt;
}

// response_format: {"type": "text"}, {"type": "json_object"} or
// {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}.
// Whether the schema can be enforced is the request builder's question.
std::optional<ApiError> ParseResponseFormat(const Fields& fields, v1::GenerateRequest& out) {
  const json* format = fields.Get("response_format");
  if (format == nullptr) return std::nullopt;
  if (!format->is_object()) return Invalid("response_format", "must be an object");
  auto type = format->find("type");
  if (type == format->end() || !type->is_string()) {
    return Invalid("response_format.type", "must be a string");
  }
  const std::string kind = type->get<std::string>();
  if (kind != "text" && kind != "json_object" && kind != "json_schema") {
    return Invalid("response_format.type",
                   StrCat("'", kind, "' is not one of text, json_object, json_schema"));
  }
  v1::ResponseFormat* proto = out.mutable_response_format();
  proto->set_type(kind);
  if (kind != "json_schema") return std::nullopt;
  auto spec = format->find("json_schema");
  if (spec == format->end() || !spec->is_object()) {
    return Invalid("response_format.json_schema", "must be an object with the schema");
  }
  auto schema = spec->find("schema");
  if (schema == spec->end() || !(schema->is_object() || schema->is_boolean())) {
    return Invalid("response_format.json_schema.schema", "must be a JSON Schema object");
  }
  proto->set_json_schema(schema->dump());
  if (auto strict = spec->find("strict"); strict != spec->end() && !strict->is_null()) {
    if (!strict->is_boolean()) {
      return Invalid("response_format.json_schema.strict", "must be a boolean");
    }
    proto->set_strict(strict->get<bool>());
  }
  return std::nullopt;
}

std::optional<ApiError> ParseStop(const Fields& fields, v1::GenerateRequest& out) {
  const json* stop = fields.Get("stop");
  if (stop == nullptr) return std::nullopt;
  if (stop->is_string()) {
    out.add_stop(stop->get<std::string>());
    return std::nullopt;
  }
  if (!stop->is_array()) return Invalid("stop", "must be a string or a list of strings");
  for (const json& s : *stop) {
    if (!s.is_string()) return Invalid("stop", "must be a string or a list of strings");
    out.add_stop(s.get<std::string>());
  }
  return std::nullopt;
}

// What Tandem does not do: each refused with the parameter named.
std::optional<ApiError> RefuseUnsupported(const Fields& fields, Endpoint endpoint) {
  std::optional<int64_t> n;
  TANDEM_RETURN_IF_ERROR(fields.Integer("n", &n));
  if (n.has_value() && *n != 1) return Unsupported("n", "n other than 1");
  std::optional<int64_t> best_of;
  TANDEM_RETURN_IF_ERROR(fields.Integer("best_of", &best_of));
  if (best_of.has_value() && *best_of != 1) return Unsupported("best_of", "best_of other than 1");
  for (const char* penalty : {"presence_penalty", "frequency_penalty", "repetition_penalty"}) {
    std::optional<double> value;
    TANDEM_RETURN_IF_ERROR(fields.Number(penalty, &value));
    const double neutral = std::string_view(penalty) == "repetition_penalty" ? 1.0 : 0.0;
    if (value.has_value() && *value != neutral) return Unsupported(penalty, penalty);
  }
  if (const json* bias = fields.Get("logit_bias"); bias != nullptr && !bias->empty()) {
    return Unsupported("logit_bias", "logit_bias");
  }
  if (endpoint == Endpoint::kCompletions) {
    bool echo = false;
    TANDEM_RETURN_IF_ERROR(fields.Bool("echo", &echo));
    if (echo) return Unsupported("echo", "echo");
    if (const json* suffix = fields.Get("suffix");
        suffix != nullptr && !(suffix->is_string() && suffix->get<std::string>().empty())) {
      return Unsupported("suffix", "suffix");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ParseSampling(const Fields& fields, v1::GenerateRequest& out) {
  v1::SamplingParams& sampling = *out.mutable_sampling();
  std::optional<double> temperature, top_p;
  TANDEM_RETURN_IF_ERROR(fields.Number("temperature", &temperature));
  if (temperature.has_value()) sampling.set_temperature(static_cast<float>(*temperature));
  TANDEM_RETURN_IF_ERROR(fields.Number("top_p", &top_p));
  if (top_p.has_value()) sampling.set_top_p(static_cast<float>(*top_p));
  std::optional<int64_t> top_k, seed;
  TANDEM_RETURN_IF_ERROR(fields.Integer("top_k", &top_k));
  // vLLM's and llama.cpp's "off" is -1 (or 0); Tandem's is 0.
  if (top_k.has_value()) sampling.set_top_k(*top_k == -1 ? 0 : ClampToInt32(*top_k));
  TANDEM_RETURN_IF_ERROR(fields.Integer("seed", &seed));
  if (seed.has_value()) sampling.set_seed(static_cast<uint64_t>(*seed));
  return std::nullopt;
}

// Tandem's own fields, accepted beside OpenAI's (as vLLM accepts its own).
std::optional<ApiError> ParseExtensions(const Fields& fields, v1::GenerateRequest& out) {
  std::optional<std::string> text;
  TANDEM_RETURN_IF_ERROR(fields.String("cache_salt", &text));
  if (text) out.set_cache_salt(*text);
  text.reset();
  TANDEM_RETURN_IF_ERROR(fields.String("workload", &text));
  if (text) out.set_workload(*text);
  std::optional<int64_t> number;
  TANDEM_RETURN_IF_ERROR(fields.Integer("expected_output_tokens", &number));
  if (number) out.set_expected_output_tokens(ClampToInt32(*number));
  number.reset();
  TANDEM_RETURN_IF_ERROR(fields.Integer("priority", &number));
  if (number) out.set_priority(ClampToInt32(*number));
  bool flag = false;
  TANDEM_RETURN_IF_ERROR(fields.Bool("ignore_eos", &flag));
  out.set_ignore_eos(flag);
  flag = false;
  TANDEM_RETURN_IF_ERROR(fields.Bool("disable_speculation", &flag));
  out.set_disable_speculation(flag);
  if (const json* ids = fields.Get("stop_token_ids"); ids != nullptr) {
    if (!ids->is_array()) return Invalid("stop_token_ids", "must be a list of token ids");
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<uint32_t>::max()) {
        return Invalid("stop_token_ids", "must be a list of token ids");
      }
      out.add_stop_token_ids(static_cast<uint32_t>(id.get<int64_t>()));
    }
  }
  if (const json* budget = fields.Get("latency_budget"); budget != nullptr) {
    if (!budget->is_object()) return Invalid("latency_budget", "must be an object");
    const Fields budget_fields(*budget);
    std::optional<double> ttft, tpot;
    if (budget_fields.Number("ttft_ms", &ttft)) {
      return Invalid("latency_budget.ttft_ms", "must be a number");
    }
    if (budget_fields.Number("tpot_ms", &tpot)) {
      return Invalid("latency_budget.tpot_ms", "must be a number");
    }
    if (ttft) out.mutable_latency_budget()->set_ttft_ms(*ttft);
    if (tpot) out.mutable_latency_budget()->set_tpot_ms(*tpot);
  }
  return std::nullopt;
}

std::optional<ApiError> ParseLogprobs(const Fields& fields, ParsedRequest& out) {
  if (out.endpoint == Endpoint::kChatCompletions) {
    TANDEM_RETURN_IF_ERROR(fields.Bool("logprobs", &out.logprobs));
    std::optional<int64_t> top;
    TANDEM_RETURN_IF_ERROR(fields.Integer("top_logprobs", &top));
    if (top.has_value()) {
      if (*top < 0 || *top > 20) return Invalid("top_logprobs", "must be in 0..20");
      if (!out.logprobs && *top > 0) {
        return Invalid("top_logprobs", "needs logprobs set to true");
      }
      out.top_logprobs = static_cast<int32_t>(*top);
    }
  } else {
    // Completions: logprobs is the number of alternatives (0: the chosen
    // token's only).
    std::optional<int64_t> count;
    TANDEM_RETURN_IF_ERROR(fields.Integer("logprobs", &count));
    if (count.has_value()) {
      if (*count < 0 || *count > 20) return Invalid("logprobs", "must be in 0..20");
      out.logprobs = true;
      out.top_logprobs = static_cast<int32_t>(*count);
    }
  }
  // The engine reports the chosen token's log-probability with its
  // alternatives; asking for one alternative gets it when none are wanted.
  if (out.logprobs) out.generate.set_logprobs(std::max(out.top_logprobs, 1));
  return std::nullopt;
}

// The OpenAI name of the field a Tandem error message starts with.
std::string ParamOf(std::string_view message, bool chat) {
  const size_t colon = message.find(':');
  if (colon == std::string_view::npos || colon > 64) return "";
  std::string field(message.substr(0, colon));
  if (field.find(' ') != std::string::npos) return "";
  if (field.rfind("sampling.", 0) == 0) field = field.substr(9);
  if (chat && (field == "prompt" || field == "token_ids")) field = "messages";
  if (!chat && field == "token_ids") field = "prompt";
  if (chat && field == "logprobs") field = "top_logprobs";
  return field;
}

json UsageJson(const v1::Usage& usage) {
  return json{{"prompt_tokens", usage.prompt_tokens()},
              {"completion_tokens", usage.completion_tokens()},
              {"total_tokens", usage.prompt_tokens() + usage.completion_tokens()},
              {"prompt_tokens_details", {{"cached_tokens", usage.cached_prompt_tokens()}}}};
}

const char* FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    default:
      return nullptr;
  }
}

json FinishReasonJson(v1::FinishReason reason) {
  const char* name = FinishReasonName(reason);
  return name == nullptr ? json(nullptr) : json(name);
}

json TokenIds(const v1::GenerateResponse& message) {
  json ids = json::array();
  for (uint32_t id : message.token_ids()) ids.push_back(id);
  return ids;
}

std::string Sse(const json& value) { return StrCat("data: ", value.dump(), "\n\n"); }

}  // namespace

std::string ErrorBody(const ApiError& error) {
  json body = {{"error",
                {{"message", error.message},
                 {"type", error.type},
                 {"param", error.param.empty() ? json(nullptr) : json(error.param)},
                 {"code", error.code.empty() ? json(nullptr) : json(error.code)}}}};
  return body.dump();
}

ApiError FromStatus(const absl::Status& status, bool chat) {
  ApiError error;
  error.message = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      error.http_status = 400;
      error.param =
          ParamOf(std::string_view(status.message().data(), status.message().size()), chat);
      break;
    case absl::StatusCode::kFailedPrecondition:
      error.http_status = 400;
      break;
    case absl::StatusCode::kUnauthenticated:
      error.http_status = 401;
      error.type = "authentication_error";
      error.code = "invalid_api_key";
      break;
    case absl::StatusCode::kPermissionDenied:
      error.http_status = 403;
      error.type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      error.http_status = 404;
      error.type = "not_found_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      error.http_status = 429;
      error.type = "rate_limit_error";
      error.code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      error.http_status = 503;
      error.type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      error.http_status = 504;
      error.type = "timeout";
      break;
    default:
      error.http_status = 500;
      error.type = "server_error";
      break;
  }
  return error;
}

std::variant<ParsedRequest, ApiError> ParseRequest(std::string_view body, Endpoint endpoint) {
  const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return Invalid("body", "is not valid JSON");
  if (!parsed.is_object()) return Invalid("body", "must be a JSON object");
  const Fields fields(parsed);
  ParsedRequest out;
  out.endpoint = endpoint;
  std::optional<std::string> model;
  TANDEM_RETURN_IF_ERROR(fields.String("model", &model));
  if (!model.has_value()) return Invalid("model", "is required");
  out.model = *model;
  TANDEM_RETURN_IF_ERROR(RefuseUnsupported(fields, endpoint));
  TANDEM_RETURN_IF_ERROR(endpoint == Endpoint::kChatCompletions
                             ? ParseMessages(fields, out.generate)
                             : ParsePrompt(fields, out.generate));
  TANDEM_RETURN_IF_ERROR(ParseSampling(fields, out.generate));
  // max_completion_tokens is the newer name; it wins when both are given.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    std::optional<int64_t> max_tokens;
    TANDEM_RETURN_IF_ERROR(fields.Integer(name, &max_tokens));
    if (!max_tokens.has_value()) continue;
    if (*max_tokens < 1) return Invalid(name, "must be at least 1");
    out.generate.set_max_tokens(ClampToInt32(*max_tokens));
  }
  TANDEM_RETURN_IF_ERROR(ParseStop(fields, out.generate));
  if (endpoint == Endpoint::kChatCompletions) {
    TANDEM_RETURN_IF_ERROR(ParseTools(fields, out.generate));
  }
  TANDEM_RETURN_IF_ERROR(ParseResponseFormat(fields, out.generate));
  TANDEM_RETURN_IF_ERROR(ParseLogprobs(fields, out));
  TANDEM_RETURN_IF_ERROR(fields.Bool("stream", &out.stream));
  TANDEM_RETURN_IF_ERROR(fields.Bool("return_token_ids", &out.return_token_ids));
  if (const json* options = fields.Get("stream_options"); options != nullptr) {
    if (!options->is_object()) return Invalid("stream_options", "must be an object");
    if (!out.stream) return Invalid("stream_options", "is only allowed with stream set to true");
    if (Fields(*options).Bool("include_usage", &out.include_usage)) {
      return Invalid("stream_options.include_usage", "must be a boolean");
    }
  }
  std::optional<std::string> user;
  TANDEM_RETURN_IF_ERROR(fields.String("user", &user));
  TANDEM_RETURN_IF_ERROR(ParseExtensions(fields, out.generate));
  return out;
}

ResponseFormatter::ResponseFormatter(const ParsedRequest& request, std::string id, int64_t created,
                                     std::string model, const tokenizer::BpeTokenizer& tokenizer)
    : endpoint_(request.endpoint),
      include_usage_(request.include_usage),
      logprobs_(request.logprobs),
      top_logprobs_(request.top_logprobs),
      return_token_ids_(request.return_token_ids),
      id_(std::move(id)),
      created_(created),
      model_(std::move(model)),
      tokenizer_(tokenizer) {}

namespace {

// A token as the logprobs objects show it: its text (bytes that are not
// valid UTF-8 on their own as U+FFFD) and its raw bytes.
json TokenText(const tokenizer::BpeTokenizer& tokenizer, uint32_t id) {
  return tokenizer::SanitizeUtf8(tokenizer.TokenBytes(static_cast<tokenizer::TokenId>(id)));
}

json TokenBytes(const tokenizer::BpeTokenizer& tokenizer, uint32_t id) {
  json bytes = json::array();
  for (unsigned char c : tokenizer.TokenBytes(static_cast<tokenizer::TokenId>(id))) {
    bytes.push_back(static_cast<int>(c));
  }
  return bytes;
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
json ChatLogprobs(const tokenizer::BpeTokenizer& tokenizer,
                  const google::protobuf::RepeatedPtrField<v1::TokenLogprobs>& entries,
                  int32_t top) {
  json content = json::array();
  for (const v1::TokenLogprobs& entry : entries) {
    json alternatives = json::array();
    for (int i = 0; i < std::min<int>(top, entry.top_size()); ++i) {
      const v1::TopLogprob& t = entry.top(i);
      alternatives.push_back({{"token", TokenText(tokenizer, t.token_id())},
                              {"logprob", t.logprob()},
                              {"bytes", TokenBytes(tokenizer, t.token_id())}});
    }
    content.push_back({{"token", TokenText(tokenizer, entry.token_id())},
                       {"logprob", entry.logprob()},
                       {"bytes", TokenBytes(tokenizer, entry.token_id())},
                       {"top_logprobs", std::move(alternatives)}});
  }
  return json{{"content", std::move(content)}};
}

// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
json CompletionLogprobs(const tokenizer::BpeTokenizer& tokenizer,
                        const google::protobuf::RepeatedPtrField<v1::TokenLogprobs>& entries,
                        int32_t top, int64_t* text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), tops = json::array(),
       offsets = json::array();
  for (const v1::TokenLogprobs& entry : entries) {
    json text = TokenText(tokenizer, entry.token_id());
    offsets.push_back(*text_offset);
    *text_offset += static_cast<int64_t>(text.get_ref<const std::string&>().size());
    tokens.push_back(std::move(text));
    token_logprobs.push_back(entry.logprob());
    json alternatives = json::object();
    for (int i = 0; i < std::min<int>(top, entry.top_size()); ++i) {
      alternatives[TokenText(tokenizer, entry.top(i).token_id()).get<std::string>()] =
          entry.top(i).logprob();
    }
    tops.push_back(std::move(alternatives));
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

}  // namespace

std::string ResponseFormatter::StreamEvents(const v1::GenerateResponse& message) {
  std::string events;
  const bool final = message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  if (final) usage_ = message.usage();
  const bool has_logprobs = logprobs_ && message.logprobs_size() > 0;
  const bool has_text = !message.text().empty();
  const bool chat = endpoint_ == Endpoint::kChatCompletions;
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  auto chunk = [&] {
    json event = {{"id", id_},
                  {"object", chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", created_},
                  {"model", model_},
                  {"choices", json::array({choice})}};
    // With include_usage every chunk says usage: null but the last.
    if (include_usage_) event["usage"] = nullptr;
    events += Sse(event);
  };
  if (chat && !role_sent_) {
    // The first chunk opens the assistant's turn, as OpenAI's does.
    role_sent_ = true;
    choice["delta"] = {{"role", "assistant"}, {"content", ""}};
    chunk();
  }
  const bool has_ids = return_token_ids_ && message.token_ids_size() > 0;
  if (chat && !message.reasoning().empty()) {
    json reasoning = choice;
    reasoning["delta"] = {{"reasoning_content", message.reasoning()}};
    json saved = choice;
    choice = std::move(reasoning);
    chunk();
    choice = std::move(saved);
  }
  if (chat && message.tool_calls_size() > 0) {
    // Each call arrives whole: one delta with its id, name and arguments.
    json calls = json::array();
    for (const v1::ToolCall& call : message.tool_calls()) {
      calls.push_back({{"index", tool_calls_sent_++},
                       {"id", call.id()},
                       {"type", "function"},
                       {"function", {{"name", call.name()}, {"arguments", call.arguments()}}}});
    }
    json saved = choice;
    choice["delta"] = {{"tool_calls", std::move(calls)}};
    chunk();
    choice = std::move(saved);
  }
  if (has_text || has_logprobs || has_ids) {
    if (has_ids) choice["token_ids"] = TokenIds(message);
    if (chat) {
      choice["delta"] = {{"content", message.text()}};
      if (has_logprobs)
        choice["logprobs"] = ChatLogprobs(tokenizer_, message.logprobs(), top_logprobs_);
    } else {
      choice["text"] = message.text();
      if (has_logprobs) {
        choice["logprobs"] =
            CompletionLogprobs(tokenizer_, message.logprobs(), top_logprobs_, &text_offset_);
      }
    }
    chunk();
  }
  if (final) {
    choice.erase("token_ids");
    choice["logprobs"] = nullptr;
    choice["finish_reason"] =
        tool_calls_sent_ > 0 && message.finish_reason() == v1::FINISH_REASON_STOP
            ? json("tool_calls")
            : FinishReasonJson(message.finish_reason());
    if (chat) {
      choice["delta"] = json::object();
    } else {
      choice["text"] = "";
    }
    chunk();
  }
  return events;
}

std::string ResponseFormatter::StreamEnd() {
  std::string events;
  if (include_usage_ && usage_.has_value()) {
    json chunk = {{"id", id_},
                  {"object", endpoint_ == Endpoint::kChatCompletions ? "chat.completion.chunk"
                                                                     : "text_completion"},
                  {"created", created_},
                  {"model", model_},
                  {"choices", json::array()},
                  {"usage", UsageJson(*usage_)}};
    events += Sse(chunk);
  }
  events += "data: [DONE]\n\n";
  return events;
}

std::string ResponseFormatter::StreamError(const ApiError& error) {
  return StrCat("data: ", ErrorBody(error), "\n\ndata: [DONE]\n\n");
}

std::string ResponseFormatter::Whole(const v1::GenerateResponse& merged) {
  const bool chat = endpoint_ == Endpoint::kChatCompletions;
  json choice = {{"index", 0},
                 {"logprobs", nullptr},
                 {"finish_reason", FinishReasonJson(merged.finish_reason())}};
  if (return_token_ids_) choice["token_ids"] = TokenIds(merged);
  if (chat) {
    json message = {{"role", "assistant"}, {"content", merged.text()}};
    if (!merged.reasoning().empty()) message["reasoning_content"] = merged.reasoning();
    if (merged.tool_calls_size() > 0) {
      if (merged.text().empty()) message["content"] = nullptr;
      json calls = json::array();
      for (const v1::ToolCall& call : merged.tool_calls()) {
        calls.push_back({{"id", call.id()},
                         {"type", "function"},
                         {"function", {{"name", call.name()}, {"arguments", call.arguments()}}}});
      }
      message["tool_calls"] = std::move(calls);
      if (merged.finish_reason() == v1::FINISH_REASON_STOP) choice["finish_reason"] = "tool_calls";
    }
    choice["message"] = std::move(message);
    if (logprobs_) choice["logprobs"] = ChatLogprobs(tokenizer_, merged.logprobs(), top_logprobs_);
  } else {
    choice["text"] = merged.text();
    if (logprobs_) {
      choice["logprobs"] =
          CompletionLogprobs(tokenizer_, merged.logprobs(), top_logprobs_, &text_offset_);
    }
  }
  json body = {{"id", id_},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", model_},
               {"choices", json::array({std::move(choice)})},
               {"usage", UsageJson(merged.usage())}};
  return body.dump();
}

namespace {

json ModelJson(std::string_view served_name, int64_t created) {
  return {{"id", served_name}, {"object", "model"}, {"created", created}, {"owned_by", "tandem"}};
}

}  // namespace

std::string ModelsBody(std::string_view served_name, int64_t created) {
  json body = {{"object", "list"}, {"data", json::array({ModelJson(served_name, created)})}};
  return body.dump();
}

std::string ModelBody(std::string_view served_name, int64_t created) {
  return ModelJson(served_name, created).dump();
}

}  // namespace tandem::server::openai
