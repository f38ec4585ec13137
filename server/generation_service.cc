#include "server/generation_service.h"

#include "server/generate_reactors.h"

namespace tandem::server {
namespace {

// A unary reply that is complete at once.
grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(status));
  return reactor;
}

// The client's deadline, if it set one.
std::optional<absl::Time> ClientDeadline(const grpc::CallbackServerContext& context) {
  if (context.deadline() == std::chrono::system_clock::time_point::max()) return std::nullopt;
  return absl::FromChrono(context.deadline());
}

}  // namespace

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto* reactor = new StreamingGenerate(context, frontend_->scheduler(),
                                        frontend_->open_calls_counter(), frontend_->watchdog());
  std::string request_id;
  if (absl::Status s = frontend_->Start(*request, ClientDeadline(*context), reactor->channel(),
                                        reactor->link(), &request_id);
      !s.ok()) {
    reactor->Reject(ToGrpc(s));
  } else {
    reactor->Started(std::move(request_id));
  }
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GenerateUnary(grpc::CallbackServerContext* context,
                                                           const v1::GenerateRequest* request,
                                                           v1::GenerateResponse* response) {
  auto* reactor =
      new UnaryGenerate(frontend_->scheduler(), response, frontend_->open_calls_counter());
  if (absl::Status s =
          frontend_->Start(*request, ClientDeadline(*context), reactor->channel(), reactor->link());
      !s.ok()) {
    reactor->Reject(ToGrpc(s));
  }
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const v1::TokenizeRequest* request,
                                                      v1::TokenizeResponse* response) {
  absl::StatusOr<v1::TokenizeResponse> tokens = frontend_->Tokenize(*request);
  if (tokens.ok()) *response = *std::move(tokens);
  return Reply(context, tokens.status());
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetModelInfoRequest*,
                                                          v1::ModelInfo* response) {
  *response = frontend_->ModelInfo();
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* GenerationService::GetLoad(grpc::CallbackServerContext* context,
                                                     const v1::GetLoadRequest*,
                                                     v1::Load* response) {
  *response = frontend_->Load();
  return Reply(context, absl::OkStatus());
}

}  // namespace tandem::server
