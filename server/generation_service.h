// The tandem.v1.Generation gRPC service (callback API): a thin adapter from
// gRPC calls to the transport-neutral GenerationFrontend.
//
// API keys are checked before any of this runs, in gRPC's transport
// (grpc_auth.h). Generate and GenerateUnary validate and tokenize on the gRPC
// thread, submit to the scheduler and return a reactor that the scheduler
// thread then feeds (generate_reactors.h). Tokenize, GetModelInfo and GetLoad
// answer at once.
#ifndef TANDEM_SERVER_GENERATION_SERVICE_H_
#define TANDEM_SERVER_GENERATION_SERVICE_H_

#include "server/generation_frontend.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::server {

class GenerationService final : public v1::Generation::CallbackService {
 public:
  // `frontend` must outlive the service.
  explicit GenerationService(GenerationFrontend* frontend) : frontend_(frontend) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* GenerateUnary(grpc::CallbackServerContext* context,
                                          const v1::GenerateRequest* request,
                                          v1::GenerateResponse* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const v1::GetLoadRequest* request, v1::Load* response) override;

 private:
  GenerationFrontend* frontend_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_GENERATION_SERVICE_H_
