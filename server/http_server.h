// An HTTP/1.1 server for the daemon's HTTP APIs (the OpenAI-compatible one:
// openai_service.h). Boost.Beast and Asio stay inside http_server.cc; this
// header is what the rest of the daemon sees.
//
// Asynchronous: a few threads serve any number of connections (a thread per
// connection is what makes a server fail its health checks under load).
// Keep-alive, optional TLS, and limits on everything a client controls:
// header and body size (431, 413), open connections (over the limit a new
// one gets 503 and is closed), idle time between requests, and how long one
// response write may wait on a client that does not read (then the client
// counts as gone).
#ifndef TANDEM_SERVER_HTTP_SERVER_H_
#define TANDEM_SERVER_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // the path, with any query string
  std::string body;
  // Header values by lower-case name (the last of repeated headers).
  std::vector<std::pair<std::string, std::string>> headers;

  // The header's value, or empty.
  std::string_view Header(std::string_view lower_case_name) const;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// One request's response, answered from any thread, exactly once: either
// Respond, or StartStream, any number of Write, then End. Calls after the
// client is gone are dropped.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual void Respond(int status, std::string content_type, std::string body,
                       HttpHeaders headers = {}) = 0;
  // A chunked response (e.g. server-sent events) whose body follows.
  virtual void StartStream(int status, std::string content_type, HttpHeaders headers = {}) = 0;
  virtual void Write(std::string data) = 0;
  virtual void End() = 0;
  // Runs `work` on this exchange's connection, in order with the other
  // calls (to format output off the caller's thread).
  virtual void Post(std::function<void()> work) = 0;
  // `callback` runs once, on some thread, when the client goes away before
  // the response is complete: it closed the connection, a write failed, or
  // a write waited longer than the write timeout. At once if already gone.
  virtual void OnClientGone(std::function<void(bool slow_reader)> callback) = 0;
};

// Serves requests; called on one of the server's threads, which it must not
// block for long (parse, validate, submit; never wait for a generation).
class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  virtual void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) = 0;
};

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;            // 0: any free port (see HttpServer::port)
  std::string tls_cert_file;  // PEM; with tls_key_file serves HTTPS only
  std::string tls_key_file;
  int threads = 2;
  int64_t max_body_bytes = 8 << 20;
  int64_t max_header_bytes = 16 << 10;
  int max_connections = 4096;
  absl::Duration idle_timeout = absl::Minutes(5);    // between requests on a connection
  absl::Duration read_timeout = absl::Seconds(60);   // to read one request once begun
  absl::Duration write_timeout = absl::Seconds(60);  // one write to a client (zero: none)
};

class HttpServer {
 public:
  // Binds and starts serving. INVALID_ARGUMENT for an address that cannot
  // be bound or TLS files that cannot be used. `handler` must outlive the
  // server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler* handler);
  ~HttpServer();  // Shutdown()

  // The bound port.
  int port() const;
  int64_t open_connections() const;
  // Stops accepting, closes every connection and joins the threads. Exchanges
  // still held elsewhere (by requests the scheduler has not finished) drop
  // whatever they are given afterwards.
  void Shutdown();

  class Impl;

 private:
  explicit HttpServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_HTTP_SERVER_H_
