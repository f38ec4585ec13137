#include "server/openai_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/random_id.h"
#include "common/strings.h"
#include "server/openai_protocol.h"
#include "spdlog/spdlog.h"

namespace tandem::server {
namespace {

using openai::ApiError;
using openai::ParsedRequest;
using openai::ResponseFormatter;

constexpr char kJson[] = "application/json";
constexpr size_t kMaxRequestIdBytes = 128;

// Retry-After for the statuses a client should retry (the queue is full,
// the daemon is draining).
HttpHeaders RetryHeaders(int status) {
  if (status == 429 || status == 503) return {{"Retry-After", "1"}};
  return {};
}

// What every route answers with: counts the response in the metrics.
class Responder {
 public:
  Responder(ServerMetrics* metrics, std::string route, std::shared_ptr<HttpExchange> exchange)
      : metrics_(metrics), route_(std::move(route)), exchange_(std::move(exchange)) {}

  void Json(int status, std::string body, HttpHeaders headers = {}) {
    metrics_->OnHttpResponse(route_, status);
    exchange_->Respond(status, kJson, std::move(body), std::move(headers));
  }
  void Error(const ApiError& error) {
    Json(error.http_status, openai::ErrorBody(error), RetryHeaders(error.http_status));
  }
  void Stream(HttpHeaders headers) {
    metrics_->OnHttpResponse(route_, 200);
    exchange_->StartStream(200, "text/event-stream", std::move(headers));
  }
  const std::shared_ptr<HttpExchange>& exchange() const { return exchange_; }

 private:
  ServerMetrics* metrics_;
  std::string route_;
  std::shared_ptr<HttpExchange> exchange_;
};

// A request's output, streamed as server-sent events. The scheduler thread
// only queues messages; formatting runs on the connection's thread.
class StreamChannel final : public ResponseChannel,
                            public std::enable_shared_from_this<StreamChannel> {
 public:
  StreamChannel(std::shared_ptr<HttpExchange> exchange, ResponseFormatter formatter, bool chat,
                std::shared_ptr<OpenCall> open_call)
      : exchange_(std::move(exchange)),
        formatter_(std::move(formatter)),
        chat_(chat),
        open_call_(std::move(open_call)) {}

  void Send(v1::GenerateResponse response) override {
    {
      absl::MutexLock lock(&mu_);
      pending_.push_back(std::move(response));
      if (flush_posted_) return;
      flush_posted_ = true;
    }
    PostFlush();
  }

  void Close(absl::Status status) override {
    {
      absl::MutexLock lock(&mu_);
      close_status_ = std::move(status);
      if (flush_posted_) return;
      flush_posted_ = true;
    }
    PostFlush();
  }

 private:
  void PostFlush() {
    exchange_->Post([self = shared_from_this()] { self->Flush(); });
  }

  // On the connection's strand.
  void Flush() {
    std::vector<v1::GenerateResponse> batch;
    std::optional<absl::Status> closed;
    {
      absl::MutexLock lock(&mu_);
      batch.swap(pending_);
      closed = close_status_;
      flush_posted_ = false;
    }
    if (ended_) return;
    std::string events;
    for (const v1::GenerateResponse& message : batch) events += formatter_.StreamEvents(message);
    if (closed.has_value()) {
      ended_ = true;
      if (closed->ok()) {
        events += formatter_.StreamEnd();
      } else {
        events += ResponseFormatter::StreamError(openai::FromStatus(*closed, chat_));
      }
    }
    exchange_->Write(std::move(events));
    if (ended_) exchange_->End();
  }

  const std::shared_ptr<HttpExchange> exchange_;
  ResponseFormatter formatter_;  // on the strand only
  const bool chat_;
  bool ended_ = false;  // on the strand only
  const std::shared_ptr<OpenCall> open_call_;
  absl::Mutex mu_;
  std::vector<v1::GenerateResponse> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> close_status_ ABSL_GUARDED_BY(mu_);
  bool flush_posted_ ABSL_GUARDED_BY(mu_) = false;
};

// A request answered in one response once it is done.
class WholeChannel final : public ResponseChannel,
                           public std::enable_shared_from_this<WholeChannel> {
 public:
  WholeChannel(Responder responder, ResponseFormatter formatter, bool chat,
               std::shared_ptr<OpenCall> open_call)
      : responder_(std::move(responder)),
        formatter_(std::move(formatter)),
        chat_(chat),
        open_call_(std::move(open_call)) {}

  void Send(v1::GenerateResponse response) override {
    absl::MutexLock lock(&mu_);
    MergeResponse(merged_, std::move(response));
  }

  void Close(absl::Status status) override {
    responder_.exchange()->Post([self = shared_from_this(), status = std::move(status)] {
      if (!status.ok()) return self->responder_.Error(openai::FromStatus(status, self->chat_));
      v1::GenerateResponse merged;
      {
        absl::MutexLock lock(&self->mu_);
        merged = self->merged_;
      }
      self->responder_.Json(200, self->formatter_.Whole(merged));
    });
  }

 private:
  Responder responder_;
  ResponseFormatter formatter_;
  const bool chat_;
  const std::shared_ptr<OpenCall> open_call_;
  absl::Mutex mu_;
  v1::GenerateResponse merged_ ABSL_GUARDED_BY(mu_);
};

ApiError NotFound(std::string message, std::string code) {
  ApiError error;
  error.http_status = 404;
  error.type = "not_found_error";
  error.message = std::move(message);
  error.code = std::move(code);
  return error;
}

}  // namespace

OpenAiService::OpenAiService(GenerationFrontend* frontend, OpenAiServiceOptions options)
    : frontend_(frontend),
      options_(std::move(options)),
      started_(absl::ToUnixSeconds(absl::Now())) {}

bool OpenAiService::KnownModel(std::string_view name) const {
  if (name == options_.served_model_name) return true;
  for (const std::string& alias : options_.aliases) {
    if (name == alias) return true;
  }
  return false;
}

void OpenAiService::Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) {
  std::string_view path = request.target;
  path = path.substr(0, path.find('?'));
  ServerMetrics* metrics = frontend_->metrics();

  if (path == "/health") {
    Responder responder(metrics, "/health", std::move(exchange));
    if (request.method != "GET" && request.method != "HEAD") {
      return responder.Error({405, "/health: use GET", "invalid_request_error", "", ""});
    }
    if (!frontend_->accepting()) {
      return responder.Json(503, R"({"status":"draining"})", RetryHeaders(503));
    }
    if (!options_.healthy()) return responder.Json(503, R"({"status":"stalled"})");
    return responder.Json(200, R"({"status":"ok"})");
  }

  const bool chat = path == "/v1/chat/completions";
  const bool models = path == "/v1/models" || path.substr(0, 11) == "/v1/models/";
  const std::string route = chat || path == "/v1/completions" ? std::string(path)
                            : models                          ? "/v1/models"
                                                              : "other";
  Responder responder(metrics, route, exchange);

  if (options_.api_keys != nullptr) {
    const std::string_view authorization = request.Header("authorization");
    absl::Status allowed = options_.api_keys->Check(
        path, authorization.empty() ? std::nullopt : std::optional(authorization));
    if (!allowed.ok()) {
      metrics->OnUnauthenticated();
      ApiError error = openai::FromStatus(allowed, chat);
      error.message = StrCat(error.message, " (send 'Authorization: Bearer <key>')");
      return responder.Error(error);
    }
  }

  if (models) {
    if (request.method != "GET") {
      return responder.Error({405, "/v1/models: use GET", "invalid_request_error", "", ""});
    }
    if (path == "/v1/models") {
      return responder.Json(200, openai::ModelsBody(options_.served_model_name, started_));
    }
    const std::string_view id = path.substr(std::string_view("/v1/models/").size());
    if (!KnownModel(id)) {
      return responder.Error(
          NotFound(StrCat("model '", id, "' does not exist"), "model_not_found"));
    }
    return responder.Json(200, openai::ModelBody(options_.served_model_name, started_));
  }
  if (chat || path == "/v1/completions") {
    if (request.method != "POST") {
      return responder.Error({405, StrCat(path, ": use POST"), "invalid_request_error", "", ""});
    }
    return Generate(request, chat, std::move(exchange));
  }
  responder.Error(NotFound(StrCat("no route for ", request.method, " ", path), "unknown_url"));
}

void OpenAiService::Generate(const HttpRequest& request, bool chat,
                             std::shared_ptr<HttpExchange> exchange) {
  const std::string route = chat ? "/v1/chat/completions" : "/v1/completions";
  Responder responder(frontend_->metrics(), route, exchange);
  std::variant<ParsedRequest, ApiError> parsed = openai::ParseRequest(
      request.body, chat ? openai::Endpoint::kChatCompletions : openai::Endpoint::kCompletions);
  if (ApiError* error = std::get_if<ApiError>(&parsed)) {
    frontend_->metrics()->OnRejected();
    return responder.Error(*error);
  }
  ParsedRequest& r = std::get<ParsedRequest>(parsed);
  if (!KnownModel(r.model)) {
    frontend_->metrics()->OnRejected();
    ApiError error = NotFound(StrCat("model '", r.model, "' does not exist; this server serves '",
                                     options_.served_model_name, "'"),
                              "model_not_found");
    error.param = "model";
    return responder.Error(error);
  }
  // The client's X-Request-Id, when it gives a usable one, names the request
  // in the logs and in the response id.
  std::string request_id(request.Header("x-request-id"));
  if (request_id.empty() || request_id.size() > kMaxRequestIdBytes)
    request_id = RandomHexId("", 24);
  r.generate.set_request_id(request_id);
  const std::string id = StrCat(chat ? "chatcmpl-" : "cmpl-", request_id);
  ResponseFormatter formatter(r, id, absl::ToUnixSeconds(absl::Now()), options_.served_model_name,
                              frontend_->model().tokenizer());

  auto open_call = std::make_shared<OpenCall>(frontend_->open_calls_counter());
  auto link = std::make_shared<CancellationLink>(frontend_->scheduler());
  std::shared_ptr<ResponseChannel> channel;
  if (r.stream) {
    channel = std::make_shared<StreamChannel>(exchange, std::move(formatter), chat, open_call);
  } else {
    channel = std::make_shared<WholeChannel>(responder, std::move(formatter), chat, open_call);
  }
  // The open call lasts until the scheduler is done with the request and
  // the response is written (or the client is gone).
  ServerMetrics* metrics = frontend_->metrics();
  exchange->OnClientGone([link, open_call, metrics, request_id](bool slow_reader) {
    if (slow_reader) {
      metrics->OnSlowReaderCancelled();
      spdlog::warn("request {}: the client read nothing for the write timeout; cancelling it",
                   request_id);
    }
    link->Cancel();
  });
  if (absl::Status s = frontend_->Start(r.generate, std::nullopt, std::move(channel), *link);
      !s.ok()) {
    return responder.Error(openai::FromStatus(s, chat));
  }
  if (r.stream) responder.Stream({{"X-Request-Id", request_id}});
}

}  // namespace tandem::server
