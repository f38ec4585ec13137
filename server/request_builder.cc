#include "server/request_builder.h"

#include <cmath>

#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "server/forced_tool_call.h"

namespace tandem::server {
namespace {

absl::Status Invalid(std::string_view field, std::string_view problem);

// The grammar response_format asks for; null for free text.
absl::StatusOr<std::shared_ptr<grammar::GrammarState>> GrammarOf(const v1::ResponseFormat& format,
                                                                 bool ignore_eos,
                                                                 const ModelLimits& model) {
  const std::string& type = format.type();
  if (type.empty() || type == "text") return nullptr;
  if (type != "json_object" && type != "json_schema") {
    return Invalid("response_format.type",
                   StrCat("'", type, "' is not one of text, json_object, json_schema"));
  }
  if (model.grammar == nullptr) {
    return Invalid("response_format", "structured output is not available on this server");
  }
  if (ignore_eos) {
    return Invalid("ignore_eos",
                   "cannot go with response_format: a structured answer ends with the model's "
                   "end-of-turn token once it is complete");
  }
  if (type == "json_object") {
    return std::make_shared<grammar::GrammarState>(model.grammar->JsonObject());
  }
  if (format.json_schema().size() > kMaxJsonSchemaBytes) {
    return Invalid("response_format.json_schema",
                   StrCat("longer than ", kMaxJsonSchemaBytes, " bytes"));
  }
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> compiled =
      model.grammar->CompileJsonSchema(format.json_schema(), format.strict());
  if (!compiled.ok()) {
    return Invalid("response_format.json_schema", std::string(compiled.status().message()));
  }
  return std::make_shared<grammar::GrammarState>(*std::move(compiled));
}

// The grammar of a forced tool call (tool_choice "required" or a name).
absl::StatusOr<std::shared_ptr<grammar::GrammarState>> ForcedCallGrammar(
    const v1::GenerateRequest& proto, const ModelLimits& model) {
  const std::string& type = proto.response_format().type();
  if (!type.empty() && type != "text") {
    return Invalid("response_format",
                   "cannot go with a forced tool call (tool_choice): the answer is the call");
  }
  if (model.grammar == nullptr) {
    return Invalid("tool_choice", "forcing a call is not available on this server");
  }
  if (proto.ignore_eos()) {
    return Invalid("ignore_eos",
                   "cannot go with a forced tool call: the answer ends with the model's "
                   "end-of-turn token after its calls");
  }
  size_t schemas = 0;
  for (const v1::Tool& tool : proto.tools()) schemas += tool.parameters().size();
  if (schemas > kMaxJsonSchemaBytes) {
    return Invalid("tools", StrCat("their parameters' schemas exceed ", kMaxJsonSchemaBytes,
                                   " bytes in all, the most a forced call compiles"));
  }
  absl::StatusOr<grammar::GrammarVocabulary::TaggedJson> calls =
      ForcedToolCalls(model.tool_call_format, proto.tools(), proto.tool_choice(),
                      !proto.has_parallel_tool_calls() || proto.parallel_tool_calls());
  if (!calls.ok()) return calls.status();
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> compiled =
      model.grammar->CompileTaggedJson(*calls);
  if (!compiled.ok()) {
    return Invalid("tools", StrCat("a forced call cannot be built from their parameters: ",
                                   compiled.status().message()));
  }
  return std::make_shared<grammar::GrammarState>(*std::move(compiled));
}

absl::Status Invalid(std::string_view field, std::string_view problem) {
  return absl::InvalidArgumentError(StrCat(field, ": ", problem));
}

}  // namespace

absl::StatusOr<std::vector<scheduler::TokenId>> CheckTokenIds(
    const google::protobuf::RepeatedField<uint32_t>& ids, std::string_view field, int32_t vocab) {
  std::vector<scheduler::TokenId> checked;
  checked.reserve(static_cast<size_t>(ids.size()));
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] >= static_cast<uint32_t>(vocab)) {
      return Invalid(
          StrCat(field, "[", i, "]"),
          StrCat("token id ", ids[i], " is outside the vocabulary (", vocab, " tokens)"));
    }
    checked.push_back(static_cast<scheduler::TokenId>(ids[i]));
  }
  return checked;
}

absl::Status ValidateDefaults(const RequestDefaults& d) {
  if (!std::isfinite(d.temperature) || d.temperature < 0.0f) {
    return absl::InvalidArgumentError(
        StrCat("--default_temperature=", d.temperature, ": must be a finite number >= 0"));
  }
  if (!(d.top_p > 0.0f && d.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(StrCat("--default_top_p=", d.top_p, ": must be in (0, 1]"));
  }
  if (d.top_k < 0) {
    return absl::InvalidArgumentError(
        StrCat("--default_top_k=", d.top_k, ": must be >= 0 (0 disables it)"));
  }
  if (d.max_tokens < 1) {
    return absl::InvalidArgumentError(
        StrCat("--max_tokens_default=", d.max_tokens, ": must be >= 1"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSampling(const step::SamplingParams& s, int32_t logprobs,
                              std::string_view prefix) {
  if (!std::isfinite(s.temperature) || s.temperature < 0.0f) {
    return Invalid(StrCat(prefix, "temperature"), "must be a finite number >= 0");
  }
  if (s.top_k < 0) return Invalid(StrCat(prefix, "top_k"), "must be >= 0 (0 disables it)");
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return Invalid(StrCat(prefix, "top_p"), "must be in (0, 1]");
  }
  if (logprobs < 0 || logprobs > kMaxLogprobs) {
    return Invalid("logprobs", StrCat("must be in 0..", kMaxLogprobs));
  }
  return absl::OkStatus();
}

absl::StatusOr<scheduler::LatencyBudget> LatencyBudgetFromProto(const v1::LatencyBudget& proto,
                                                                std::string_view field) {
  const double limit_ms = absl::ToDoubleMilliseconds(scheduler::MaxLatencyBudget());
  scheduler::LatencyBudget budget;
  for (const auto& [name, ms, out] : {std::tuple{"ttft_ms", proto.ttft_ms(), &budget.ttft},
                                      std::tuple{"tpot_ms", proto.tpot_ms(), &budget.tpot}}) {
    if (ms == 0) continue;  // the daemon's
    if (!std::isfinite(ms) || ms < 0 || ms > limit_ms) {
      return Invalid(StrCat(field, ".", name),
                     StrCat(ms,
                            " is not a budget: expected 0 (the daemon's) or a positive "
                            "number of milliseconds up to ",
                            static_cast<int64_t>(limit_ms)));
    }
    *out = absl::Microseconds(static_cast<int64_t>(std::ceil(ms * 1000.0)));
  }
  return budget;
}

namespace {

bool IsJsonObject(const std::string& text) {
  const nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return !value.is_discarded() && value.is_object();
}

}  // namespace

absl::StatusOr<Conversation> ConversationFromProto(
    const google::protobuf::RepeatedPtrField<v1::ChatMessage>& messages,
    const google::protobuf::RepeatedPtrField<v1::Tool>& tools) {
  Conversation out;
  std::vector<tokenizer::ChatMessage>& conversation = out.messages;
  for (int i = 0; i < messages.size(); ++i) {
    const v1::ChatMessage& m = messages[i];
    tokenizer::ChatMessage& message = conversation.emplace_back();
    message.role = m.role();
    message.content = m.content();
    message.tool_call_id = m.tool_call_id();
    message.name = m.name();
    message.reasoning_content = m.reasoning_content();
    for (int j = 0; j < m.tool_calls_size(); ++j) {
      const v1::ToolCall& call = m.tool_calls(j);
      const std::string field = StrCat("messages[", i, "].tool_calls[", j, "]");
      if (call.name().empty()) return Invalid(field + ".name", "must not be empty");
      if (!IsJsonObject(call.arguments())) {
        return Invalid(field + ".arguments", "must be a JSON object's text");
      }
      message.tool_calls.push_back({call.id(), call.name(), call.arguments()});
    }
  }
  std::vector<tokenizer::ChatTool>& tool_list = out.tools;
  for (int i = 0; i < tools.size(); ++i) {
    const v1::Tool& tool = tools[i];
    if (tool.name().empty()) return Invalid(StrCat("tools[", i, "].name"), "must not be empty");
    if (!tool.parameters().empty() && !IsJsonObject(tool.parameters())) {
      return Invalid(StrCat("tools[", i, "].parameters"), "must be a JSON Schema object's text");
    }
    tool_list.push_back({tool.name(), tool.description(), tool.parameters()});
  }
  return out;
}

absl::StatusOr<std::vector<tokenizer::TokenId>> EncodeConversation(
    const google::protobuf::RepeatedPtrField<v1::ChatMessage>& messages,
    const google::protobuf::RepeatedPtrField<v1::Tool>& tools,
    const tokenizer::ChatTemplate& chat_template, const tokenizer::BpeTokenizer& tokenizer) {
  absl::StatusOr<Conversation> conversation = ConversationFromProto(messages, tools);
  if (!conversation.ok()) return conversation.status();
  return chat_template.Encode(tokenizer, conversation->messages, conversation->tools);
}

absl::StatusOr<BuiltRequest> BuildRequest(const v1::GenerateRequest& proto,
                                          const ModelLimits& model, const RequestDefaults& defaults,
                                          uint64_t random_seed) {
  BuiltRequest built;
  scheduler::Request& r = built.request;
  r.id = proto.request_id();
  const int vocab = model.tokenizer->vocab_size();

  // Input: exactly one of prompt, messages, token_ids.
  const int inputs = (proto.prompt().empty() ? 0 : 1) + (proto.messages().empty() ? 0 : 1) +
                     (proto.token_ids().empty() ? 0 : 1);
  if (inputs == 0) {
    return Invalid("prompt", "the request has no input: set one of prompt, messages or token_ids");
  }
  if (inputs > 1) {
    return Invalid("prompt", "set exactly one of prompt, messages and token_ids");
  }
  if (!proto.tools().empty() && proto.messages().empty()) {
    return Invalid("tools", "go with messages (the chat template renders them)");
  }
  const std::string& choice = proto.tool_choice();
  const bool forced_call = !choice.empty() && choice != "auto" && choice != "none";
  if (forced_call && proto.tools().empty()) {
    return Invalid("tool_choice",
                   StrCat("'", choice, "' forces a call, but the request has no tools"));
  }
  built.parse_tool_calls = !proto.tools().empty() && choice != "none";
  if (!proto.prompt().empty()) {
    r.prompt = model.tokenizer->Encode(proto.prompt(), /*parse_special=*/true);
    if (model.tokenizer->add_bos())
      r.prompt.insert(r.prompt.begin(), *model.tokenizer->special().bos);
    if (r.prompt.empty()) return Invalid("prompt", "the text produces no tokens");
  } else if (!proto.messages().empty()) {
    absl::StatusOr<std::vector<tokenizer::TokenId>> ids =
        EncodeConversation(proto.messages(), proto.tools(), *model.chat_template, *model.tokenizer);
    if (!ids.ok()) return ids.status();
    r.prompt = *std::move(ids);
    // Templates of reasoning models may open the answer's <think> themselves.
    const size_t tail = std::min<size_t>(r.prompt.size(), 4);
    std::string end;
    for (size_t i = r.prompt.size() - tail; i < r.prompt.size(); ++i) {
      end += model.tokenizer->TokenBytes(r.prompt[i]);
    }
    while (!end.empty() && (end.back() == '\n' || end.back() == ' ')) end.pop_back();
    built.starts_in_reasoning = end.size() >= 7 && end.substr(end.size() - 7) == "<think>";
  } else {
    absl::StatusOr<std::vector<scheduler::TokenId>> ids =
        CheckTokenIds(proto.token_ids(), "token_ids", vocab);
    if (!ids.ok()) return ids.status();
    r.prompt = *std::move(ids);
  }
  const int32_t prompt_tokens = static_cast<int32_t>(r.prompt.size());
  const std::string_view prompt_field =
      proto.messages().empty() ? (proto.prompt().empty() ? "token_ids" : "prompt") : "messages";
  if (prompt_tokens >= model.context_length) {
    return Invalid(prompt_field,
                   StrCat("the prompt has ", prompt_tokens, " tokens but the context holds ",
                          model.context_length, " (including at least one generated token)"));
  }
  if (model.max_prompt_tokens > 0 && prompt_tokens > model.max_prompt_tokens) {
    return Invalid(prompt_field,
                   StrCat("the prompt has ", prompt_tokens, " tokens; this server accepts at most ",
                          model.max_prompt_tokens, " (--max_prompt_tokens)"));
  }

  // Sampling.
  const v1::SamplingParams& s = proto.sampling();
  r.sampling.temperature = s.has_temperature() ? s.temperature() : defaults.temperature;
  r.sampling.top_k = s.has_top_k() ? s.top_k() : defaults.top_k;
  r.sampling.top_p = s.has_top_p() ? s.top_p() : defaults.top_p;
  r.sampling.seed = s.has_seed() ? s.seed() : random_seed;
  if (absl::Status status = ValidateSampling(r.sampling, proto.logprobs(), "sampling.");
      !status.ok()) {
    return status;
  }

  // Length.
  const int32_t room = model.context_length - prompt_tokens;
  if (proto.has_max_tokens()) {
    if (proto.max_tokens() < 1) return Invalid("max_tokens", "must be at least 1");
    if (proto.max_tokens() > room) {
      return Invalid("max_tokens",
                     StrCat(proto.max_tokens(), " tokens do not fit: the prompt has ",
                            prompt_tokens, " tokens and the context holds ", model.context_length));
    }
    r.max_tokens = proto.max_tokens();
  } else {
    r.max_tokens = std::min(room, defaults.max_tokens);
  }

  // Stops.
  if (proto.stop_size() > kMaxStopStrings) {
    return Invalid("stop", StrCat("at most ", kMaxStopStrings, " stop strings are allowed"));
  }
  for (int i = 0; i < proto.stop_size(); ++i) {
    if (proto.stop(i).empty()) return Invalid(StrCat("stop[", i, "]"), "must not be empty");
    if (proto.stop(i).size() > kMaxStopStringBytes) {
      return Invalid(StrCat("stop[", i, "]"),
                     StrCat("longer than ", kMaxStopStringBytes, " bytes"));
    }
    built.stop_strings.push_back(proto.stop(i));
  }
  if (proto.stop_token_ids_size() > kMaxStopTokenIds) {
    return Invalid("stop_token_ids", StrCat("at most ", kMaxStopTokenIds, " are allowed"));
  }
  absl::StatusOr<std::vector<scheduler::TokenId>> stop_ids =
      CheckTokenIds(proto.stop_token_ids(), "stop_token_ids", vocab);
  if (!stop_ids.ok()) return stop_ids.status();
  r.stop_token_ids = *std::move(stop_ids);
  if (proto.cache_salt().size() > kMaxCacheSaltBytes) {
    return Invalid("cache_salt", StrCat("longer than ", kMaxCacheSaltBytes, " bytes"));
  }
  r.cache_salt = proto.cache_salt();
  if (proto.workload().size() > kMaxWorkloadBytes) {
    return Invalid("workload", StrCat("longer than ", kMaxWorkloadBytes, " bytes"));
  }
  r.workload = proto.workload();
  if (proto.expected_output_tokens() < 0) {
    return Invalid("expected_output_tokens", "must be >= 0 (0: unknown)");
  }
  r.expected_output_tokens = proto.expected_output_tokens();
  absl::StatusOr<scheduler::LatencyBudget> slo =
      LatencyBudgetFromProto(proto.latency_budget(), "latency_budget");
  if (!slo.ok()) return slo.status();
  r.slo = *slo;
  r.priority = proto.priority();
  r.logprobs = proto.logprobs();
  r.disable_speculation = proto.disable_speculation();
  if (!proto.ignore_eos()) {
    const tokenizer::SpecialTokens& special = model.tokenizer->special();
    for (const auto& id : {special.eos, special.eot}) {
      if (id.has_value()) r.stop_token_ids.push_back(*id);
    }
  }
  absl::StatusOr<std::shared_ptr<grammar::GrammarState>> grammar =
      forced_call ? ForcedCallGrammar(proto, model)
                  : GrammarOf(proto.response_format(), proto.ignore_eos(), model);
  if (!grammar.ok()) return grammar.status();
  r.grammar = *std::move(grammar);
  return built;
}

}  // namespace tandem::server
