// llama.cpp's llama-server over HTTP (client/bench/targets.h): POST
// /completion with the prompt as token ids and "stream": true; every
// server-sent event carries the new tokens ("return_tokens"), the last one
// "stop": true and the timings (cache_n: prompt tokens served from its
// prompt cache).
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/bench/server_events.h"
#include "client/bench/targets.h"
#include "client/http.h"
#include "google/protobuf/util/json_util.h"

namespace tandem::bench {
namespace {

class LlamaServerTarget : public Target {
 public:
  explicit LlamaServerTarget(std::string address) : base_("http://" + std::move(address)) {}

  std::string name() const override { return "llama-server"; }

  absl::StatusOr<TokenIds> Tokenize(const std::string& text) override {
    google::protobuf::Struct request;
    (*request.mutable_fields())["content"].set_string_value(text);
    std::string body;
    (void)google::protobuf::util::MessageToJsonString(request, &body);
    std::string response;
    long http_code = 0;
    absl::Status s = client::HttpTransfer(
        base_ + "/tokenize", &body, 60, [&](const char* d, size_t n) { response.append(d, n); },
        &http_code);
    if (!s.ok()) return s;
    if (http_code != 200) return absl::UnavailableError(base_ + "/tokenize: HTTP " + response);
    absl::StatusOr<google::protobuf::Struct> parsed = ParseJson(response, "llama-server");
    if (!parsed.ok()) return parsed.status();
    TokenIds ids;
    if (const auto* tokens = Field(*parsed, "tokens")) {
      for (const auto& v : tokens->list_value().values()) {
        ids.push_back(static_cast<uint32_t>(v.number_value()));
      }
    }
    return ids;
  }

  void Generate(const GenerateCall& call, RequestRecord* record, Generated* output) override {
    const std::string body = absl::StrCat(
        "{\"prompt\":[", absl::StrJoin(call.prompt, ","), "],\"n_predict\":", call.max_tokens,
        ",\"stream\":true,\"temperature\":0,\"ignore_eos\":", call.stop_at_end ? "false" : "true",
        ",\"return_tokens\":true,\"cache_prompt\":true}");
    std::string failure;
    bool stopped = false;
    int predicted = 0;
    auto on_event = [&](const std::string& json) {
      absl::StatusOr<google::protobuf::Struct> event = ParseJson(json, "llama-server");
      if (!event.ok()) {
        failure = std::string(event.status().message());
        return;
      }
      const double now = NowSeconds();
      if (const auto* tokens = Field(*event, "tokens")) {
        for (const auto& v : tokens->list_value().values()) {
          record->token_times.push_back(now);
          output->ids.push_back(static_cast<uint32_t>(v.number_value()));
        }
      }
      if (const auto* content = Field(*event, "content"); content && call.want_text) {
        output->text += content->string_value();
      }
      if (const auto* stop = Field(*event, "stop"); stop && stop->bool_value()) {
        stopped = true;
        if (const auto* n = Field(*event, "tokens_predicted")) {
          predicted = static_cast<int>(n->number_value());
        }
        // "limit" when n_predict ran out; "eos" or "word" when it stopped.
        if (const auto* type = Field(*event, "stop_type")) {
          record->stopped = type->string_value() == "eos" || type->string_value() == "word";
        }
        if (const auto* timings = Field(*event, "timings")) {
          const auto& t = timings->struct_value();
          if (const auto* cached = Field(t, "cache_n")) {
            record->cached_prompt_tokens = static_cast<int>(cached->number_value());
          }
          // Present when it speculates (a draft model or n-gram lookup).
          if (const auto* drafted = Field(t, "draft_n")) {
            record->drafted_tokens = static_cast<int>(drafted->number_value());
          }
          if (const auto* accepted = Field(t, "draft_n_accepted")) {
            record->accepted_tokens = static_cast<int>(accepted->number_value());
          }
        }
      }
      if (const auto* error = Field(*event, "error")) {
        failure = "llama-server error: " + error->DebugString();
      }
    };
    ServerEventSplitter events(on_event);
    long http_code = 0;
    absl::Status s = client::HttpTransfer(
        base_ + "/completion", &body, call.timeout_s,
        [&](const char* data, size_t n) { events.Feed(data, n); }, &http_code,
        SessionHeaders(call));
    // Tokens the stream reported only in its count arrive with the end.
    for (int i = static_cast<int>(output->ids.size()); i < predicted; ++i) {
      record->token_times.push_back(NowSeconds());
    }
    record->prompt_tokens = static_cast<int>(call.prompt.size());
    record->ok = s.ok() && http_code == 200 && stopped && failure.empty();
    if (!s.ok()) {
      record->error = std::string(s.message());
    } else if (http_code != 200) {
      record->error = absl::StrCat("HTTP ", http_code, ": ", events.pending());
    } else if (!failure.empty()) {
      record->error = failure;
    } else if (!stopped) {
      record->error = "the stream ended without a final event";
    }
  }

 private:
  std::string base_;
};

}  // namespace

std::unique_ptr<Target> MakeLlamaServerTarget(std::string address) {
  return std::make_unique<LlamaServerTarget>(std::move(address));
}

}  // namespace tandem::bench
