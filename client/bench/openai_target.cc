// Any OpenAI-compatible server over HTTP (client/bench/targets.h): tandemd's
// HTTP API, llama-server's /v1, vLLM. POST /v1/completions with the prompt as
// token ids, greedy, "stream": true and usage in the last chunk. A chunk's
// tokens are counted from "token_ids" (asked for with return_token_ids, as
// tandemd and vLLM answer it), else from its logprobs' tokens, else one per
// chunk with text. The model is the first that GET /v1/models lists.
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/bench/server_events.h"
#include "client/bench/targets.h"
#include "client/http.h"
#include "google/protobuf/util/json_util.h"

namespace tandem::bench {
namespace {

// A chunk with "token_ids" and no usage or error: its ids appended to
// `output` and their count; nullopt for any other event.
std::optional<int> CountTokenIds(const std::string& data, TokenIds* output) {
  constexpr std::string_view kKey = "\"token_ids\":[";
  if (data.find("\"usage\":{") != std::string::npos ||
      data.find("\"error\"") != std::string::npos) {
    return std::nullopt;
  }
  const size_t at = data.find(kKey);
  if (at == std::string::npos) return std::nullopt;
  int count = 0;
  uint32_t value = 0;
  bool in_number = false;
  for (size_t i = at + kKey.size(); i < data.size() && data[i] != ']'; ++i) {
    const char c = data[i];
    if (c >= '0' && c <= '9') {
      value = value * 10 + static_cast<uint32_t>(c - '0');
      in_number = true;
    } else if (in_number) {
      output->push_back(value);
      ++count;
      value = 0;
      in_number = false;
    }
  }
  if (in_number) {
    output->push_back(value);
    ++count;
  }
  return count;
}

std::string Quoted(const std::string& text) {
  google::protobuf::Value value;
  value.set_string_value(text);
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(value, &out);
  return out;
}

class OpenAiTarget : public Target {
 public:
  OpenAiTarget(std::string address, Target* tokenizer)
      : base_("http://" + std::move(address)), tokenizer_(tokenizer) {}

  std::string name() const override { return "openai:" + base_.substr(7); }

  absl::StatusOr<TokenIds> Tokenize(const std::string& text) override {
    // The API has no tokenizer: the same model's, from tandemd. Asking for
    // the model list doubles as the readiness check.
    if (absl::StatusOr<std::string> model = Model(); !model.ok()) return model.status();
    return tokenizer_->Tokenize(text);
  }

  void Generate(const GenerateCall& call, RequestRecord* record, Generated* output) override {
    absl::StatusOr<std::string> model = Model();
    if (!model.ok()) {
      record->ok = false;
      record->error = std::string(model.status().message());
      return;
    }
    const std::string body = absl::StrCat(
        "{\"model\":", Quoted(*model), ",\"prompt\":[", absl::StrJoin(call.prompt, ","),
        "],\"max_tokens\":", call.max_tokens,
        ",\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"ignore_eos\":",
        call.stop_at_end ? "false" : "true", ",\"return_token_ids\":true",
        call.workload.empty() ? "" : absl::StrCat(",\"workload\":", Quoted(call.workload)),
        call.slo_ttft_ms > 0 || call.slo_tpot_ms > 0
            ? absl::StrCat(",\"latency_budget\":{\"ttft_ms\":", call.slo_ttft_ms,
                           ",\"tpot_ms\":", call.slo_tpot_ms, "}")
            : "",
        "}");
    std::string failure;
    bool done = false;
    int completion_tokens = -1;
    auto on_event = [&](const std::string& data) {
      if (data == "[DONE]") {
        done = true;
        return;
      }
      // The common chunk, read without a JSON parser (the client shares
      // the machine with the server: its CPU time is the server's loss).
      std::optional<int> tokens;
      if (!call.want_text) tokens = CountTokenIds(data, &output->ids);
      if (tokens.has_value()) {
        const double now = NowSeconds();
        for (int i = 0; i < *tokens; ++i) record->token_times.push_back(now);
        return;
      }
      absl::StatusOr<google::protobuf::Struct> event = ParseJson(data, "the server");
      if (!event.ok()) {
        failure = std::string(event.status().message());
        return;
      }
      if (const auto* error = Field(*event, "error")) {
        failure = "server error: " + error->DebugString();
        return;
      }
      const double now = NowSeconds();
      if (const auto* usage = Field(*event, "usage"); usage && usage->has_struct_value()) {
        const auto& u = usage->struct_value();
        if (const auto* n = Field(u, "completion_tokens")) {
          completion_tokens = static_cast<int>(n->number_value());
        }
        if (const auto* details = Field(u, "prompt_tokens_details");
            details && details->has_struct_value()) {
          if (const auto* cached = Field(details->struct_value(), "cached_tokens")) {
            record->cached_prompt_tokens = static_cast<int>(cached->number_value());
          }
        }
      }
      const auto* choices = Field(*event, "choices");
      if (choices == nullptr || choices->list_value().values_size() == 0) return;
      const auto& choice = choices->list_value().values(0).struct_value();
      if (const auto* reason = Field(choice, "finish_reason");
          reason && reason->has_string_value()) {
        record->stopped = reason->string_value() == "stop";
      }
      const auto* text = Field(choice, "text");
      if (text != nullptr && call.want_text) output->text += text->string_value();
      int count = 0;
      if (const auto* ids = Field(choice, "token_ids")) {
        for (const auto& v : ids->list_value().values()) {
          output->ids.push_back(static_cast<uint32_t>(v.number_value()));
          ++count;
        }
      } else if (const auto* lp = Field(choice, "logprobs"); lp && lp->has_struct_value()) {
        if (const auto* t = Field(lp->struct_value(), "tokens")) {
          count = t->list_value().values_size();
        }
      } else if (text != nullptr && !text->string_value().empty()) {
        count = 1;
      }
      for (int i = 0; i < count; ++i) record->token_times.push_back(now);
    };
    ServerEventSplitter events(on_event);
    long http_code = 0;
    absl::Status s = client::HttpTransfer(
        base_ + "/v1/completions", &body, call.timeout_s,
        [&](const char* data, size_t n) { events.Feed(data, n); }, &http_code,
        SessionHeaders(call));
    // Tokens only the usage counted arrive with the end.
    for (int i = static_cast<int>(record->token_times.size()); i < completion_tokens; ++i) {
      record->token_times.push_back(NowSeconds());
    }
    record->prompt_tokens = static_cast<int>(call.prompt.size());
    record->ok = s.ok() && http_code == 200 && done && failure.empty();
    if (!s.ok()) {
      record->error = std::string(s.message());
    } else if (http_code != 200) {
      record->error = absl::StrCat("HTTP ", http_code, ": ", events.pending());
    } else if (!failure.empty()) {
      record->error = failure;
    } else if (!done) {
      record->error = "the stream ended without data: [DONE]";
    }
  }

 private:
  // The served model's name, asked once.
  absl::StatusOr<std::string> Model() {
    absl::MutexLock lock(&mu_);
    if (!model_.empty()) return model_;
    std::string response;
    long http_code = 0;
    absl::Status s = client::HttpTransfer(
        base_ + "/v1/models", nullptr, 30, [&](const char* d, size_t n) { response.append(d, n); },
        &http_code);
    if (!s.ok()) return s;
    if (http_code != 200) {
      return absl::UnavailableError(absl::StrCat(base_, "/v1/models: HTTP ", http_code));
    }
    absl::StatusOr<google::protobuf::Struct> parsed = ParseJson(response, "the server");
    if (!parsed.ok()) return parsed.status();
    const auto* data = Field(*parsed, "data");
    if (data == nullptr || data->list_value().values_size() == 0) {
      return absl::UnavailableError(base_ + "/v1/models lists no model");
    }
    const auto* id = Field(data->list_value().values(0).struct_value(), "id");
    if (id == nullptr) return absl::UnavailableError(base_ + "/v1/models: a model without id");
    model_ = id->string_value();
    return model_;
  }

  std::string base_;
  Target* tokenizer_;
  absl::Mutex mu_;
  std::string model_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Target> MakeOpenAiTarget(std::string address, Target* tokenizer) {
  return std::make_unique<OpenAiTarget>(std::move(address), tokenizer);
}

}  // namespace tandem::bench
