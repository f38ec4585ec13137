// The OpenAI-compatible HTTP API, served by HttpServer beside gRPC:
//
//   POST /v1/chat/completions   POST /v1/completions   (streamed or not)
//   GET  /v1/models             GET  /v1/models/{id}
//   GET  /health                (200 ready; 503 draining or stalled; no key)
//
// Requests are translated (openai_protocol.h) and submitted through the same
// GenerationFrontend as gRPC calls: one validation, one set of limits and
// metrics, and the same drain. A client that hangs up cancels its request at
// once (its KV blocks are freed and it is counted as cancelled, as a gRPC
// cancel is). API keys, when configured, are `Authorization: Bearer` keys.
#ifndef TANDEM_SERVER_OPENAI_SERVICE_H_
#define TANDEM_SERVER_OPENAI_SERVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/api_keys.h"
#include "server/generation_frontend.h"
#include "server/http_server.h"

namespace tandem::server {

struct OpenAiServiceOptions {
  // The name /v1/models lists and the one requests' "model" must give.
  std::string served_model_name;
  // Other names requests may use for it (the GGUF's general.name).
  std::vector<std::string> aliases;
  // When set, every path but /health needs one of these keys.
  std::shared_ptr<const ApiKeys> api_keys;
  // False while the scheduler is stalled (health reports 503).
  std::function<bool()> healthy = [] { return true; };
};

class OpenAiService final : public HttpHandler {
 public:
  // `frontend` must outlive the service.
  OpenAiService(GenerationFrontend* frontend, OpenAiServiceOptions options);

  void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) override;

 private:
  void Generate(const HttpRequest& request, bool chat, std::shared_ptr<HttpExchange> exchange);
  bool KnownModel(std::string_view name) const;

  GenerationFrontend* frontend_;
  OpenAiServiceOptions options_;
  const int64_t started_;  // Unix seconds: /v1/models' "created"
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_OPENAI_SERVICE_H_
