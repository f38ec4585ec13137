// tandemd over gRPC (client/bench/targets.h).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>

#include "client/bench/targets.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::bench {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<std::pair<std::string, std::string>> SessionHeaders(const GenerateCall& call) {
  if (call.session_id.empty()) return {};
  return {{kSessionHeader, call.session_id}};
}

absl::StatusOr<TokenIds> Target::TokenizeChat(const std::vector<ChatTurn>&) {
  return absl::UnimplementedError(name() +
                                  " does not render chats: their prompts come from tandemd");
}

namespace {

// The ids of a Tokenize call, or its failure naming `address`.
absl::StatusOr<TokenIds> CallTokenize(tandem::v1::Generation::Stub& stub,
                                      const std::string& address,
                                      const tandem::v1::TokenizeRequest& request) {
  tandem::v1::TokenizeResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  const grpc::Status status = stub.Tokenize(&context, request, &response);
  if (!status.ok()) {
    return absl::UnavailableError("Tokenize on " + address + ": " + status.error_message());
  }
  return TokenIds(response.token_ids().begin(), response.token_ids().end());
}

class TandemTarget : public Target {
 public:
  TandemTarget(std::vector<std::string> addresses, std::vector<std::string> metrics_urls)
      : addresses_(std::move(addresses)), metrics_urls_(std::move(metrics_urls)) {
    for (const std::string& address : addresses_) {
      // One channel per address, shared by all requests to it (HTTP/2
      // multiplexes the streams).
      stubs_.push_back(tandem::v1::Generation::NewStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials())));
    }
  }

  std::string name() const override { return "tandem"; }
  std::vector<std::string> MetricsUrls() const override { return metrics_urls_; }

  absl::StatusOr<TokenIds> Tokenize(const std::string& text) override {
    tandem::v1::TokenizeRequest request;
    request.set_text(text);
    return CallTokenize(*stubs_[0], addresses_[0], request);
  }

  absl::StatusOr<TokenIds> TokenizeChat(const std::vector<ChatTurn>& messages) override {
    tandem::v1::TokenizeRequest request;
    for (const ChatTurn& m : messages) {
      tandem::v1::ChatMessage* message = request.add_messages();
      message->set_role(m.role);
      message->set_content(m.content);
    }
    return CallTokenize(*stubs_[0], addresses_[0], request);
  }

  void Generate(const GenerateCall& call, RequestRecord* record, Generated* output) override {
    tandem::v1::GenerateRequest request;
    request.mutable_token_ids()->Assign(call.prompt.begin(), call.prompt.end());
    request.set_max_tokens(call.max_tokens);
    request.set_ignore_eos(!call.stop_at_end);
    request.mutable_sampling()->set_temperature(0);
    request.set_workload(call.workload);
    if (call.slo_ttft_ms > 0) request.mutable_latency_budget()->set_ttft_ms(call.slo_ttft_ms);
    if (call.slo_tpot_ms > 0) request.mutable_latency_budget()->set_tpot_ms(call.slo_tpot_ms);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(call.timeout_s * 1000)));
    if (!call.session_id.empty()) context.AddMetadata(kSessionHeader, call.session_id);
    const size_t which = next_.fetch_add(1) % stubs_.size();
    auto reader = stubs_[which]->Generate(&context, request);
    tandem::v1::GenerateResponse response;
    while (reader->Read(&response)) {
      const double now = NowSeconds();
      for (uint32_t id : response.token_ids()) {
        record->token_times.push_back(now);
        output->ids.push_back(id);
      }
      if (call.want_text) output->text += response.text();
      if (response.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
        const tandem::v1::Usage& usage = response.usage();
        record->prompt_tokens = usage.prompt_tokens();
        record->cached_prompt_tokens = usage.cached_prompt_tokens();
        record->drafted_tokens = usage.drafted_tokens();
        record->accepted_tokens = usage.accepted_tokens();
        record->stopped = response.finish_reason() == tandem::v1::FINISH_REASON_STOP;
        record->path = static_cast<int>(response.path());
      }
    }
    const grpc::Status status = reader->Finish();
    record->ok = status.ok();
    if (!status.ok()) {
      record->error = addresses_[which] + ": " + std::to_string(status.error_code()) + " " +
                      status.error_message();
    }
  }

 private:
  std::vector<std::string> addresses_;
  std::vector<std::string> metrics_urls_;
  std::vector<std::unique_ptr<tandem::v1::Generation::Stub>> stubs_;
  std::atomic<size_t> next_{0};
};

}  // namespace

std::unique_ptr<Target> MakeTandemTarget(std::vector<std::string> addresses,
                                         std::vector<std::string> metrics_urls) {
  return std::make_unique<TandemTarget>(std::move(addresses), std::move(metrics_urls));
}

}  // namespace tandem::bench
