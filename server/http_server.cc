// The only translation unit that includes Boost.Beast and Asio.
//
// Beast parses requests (and enforces the header and body limits); responses
// are written as plain bytes: a head with Content-Length, or a chunked head
// followed by one chunk per Write, coalesced while a write is in flight.
//
// Each connection is a Session on its own strand. While a request is being
// answered, the session waits for the socket to become readable without
// reading it: a peek that finds the end of the stream means the client hung
// up, and the exchange's OnClientGone callbacks run (a client that pipelines
// its next request is left alone). Exchanges hold the session and server
// weakly, so a generation that outlives its connection, or the server, only
// drops its output.
#include "server/http_server.h"

#include <sys/socket.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <deque>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/strings.h"
#include "common/thread_name.h"
#include "spdlog/spdlog.h"

namespace tandem::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return absl::ToChronoNanoseconds(d);
}

std::string StatusLine(int status) {
  const beast::string_view reason = http::obsolete_reason(static_cast<http::status>(status));
  return StrCat("HTTP/1.1 ", status, " ", std::string_view(reason.data(), reason.size()), "\r\n");
}

std::string HeaderLines(const HttpHeaders& headers) {
  std::string out;
  for (const auto& [name, value] : headers) out += StrCat(name, ": ", value, "\r\n");
  return out;
}

// A short JSON error for failures found before any handler ran.
std::string ErrorResponse(int status, std::string_view message, bool keep_alive) {
  const std::string body = StrCat(R"({"error":{"message":")", message,
                                  R"(","type":"invalid_request_error","param":null,"code":null}})");
  return StrCat(StatusLine(status),
                "Content-Type: application/json\r\nContent-Length: ", body.size(),
                "\r\nConnection: ", keep_alive ? "keep-alive" : "close", "\r\n\r\n", body);
}

class SessionBase;

}  // namespace

// The server's state, shared with the exchanges (weakly) so that a late
// call finds out the server is gone. Members are ordered so that what
// sessions use (options, the connection count, the TLS context) outlives
// the io_context, whose destruction destroys the sessions.
class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, HttpHandler* handler)
      : options_(std::move(options)), handler_(handler), acceptor_(ioc_) {}

  absl::Status Listen();
  void Accept();
  void Run(int threads);
  void Shutdown();

  const HttpServerOptions& options() const { return options_; }
  HttpHandler* handler() const { return handler_; }
  bool running() const { return running_.load(); }
  std::atomic<int64_t>& connections() { return connections_; }
  int port() const { return port_; }
  // Set once, right after construction, by HttpServer::Start.
  std::weak_ptr<Impl> self;

 private:
  template <class Stream>
  void StartSession(Stream stream);

  const HttpServerOptions options_;
  HttpHandler* const handler_;
  std::atomic<bool> running_{true};
  std::atomic<int64_t> connections_{0};
  std::optional<ssl::context> tls_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

namespace {

// What an exchange asks of its session; every method runs on the session's
// strand.
class SessionBase : public std::enable_shared_from_this<SessionBase> {
 public:
  virtual ~SessionBase() = default;
  virtual void Dispatch(std::function<void()> work) = 0;
  virtual void Enqueue(const HttpExchange* from, std::string bytes, bool last) = 0;
  virtual bool IsCurrent(const HttpExchange* exchange) const = 0;
};

class Exchange final : public HttpExchange {
 public:
  Exchange(std::weak_ptr<HttpServer::Impl> server, std::weak_ptr<SessionBase> session,
           bool keep_alive)
      : server_(std::move(server)), session_(std::move(session)), keep_alive_(keep_alive) {}

  void Respond(int status, std::string content_type, std::string body,
               HttpHeaders headers) override {
    std::string bytes = StrCat(StatusLine(status), "Content-Type: ", content_type,
                               "\r\nContent-Length: ", body.size(),
                               "\r\nConnection: ", keep_alive_ ? "keep-alive" : "close", "\r\n",
                               HeaderLines(headers), "\r\n");
    bytes += body;
    Send(std::move(bytes), /*last=*/true);
  }

  void StartStream(int status, std::string content_type, HttpHeaders headers) override {
    Send(StrCat(StatusLine(status), "Content-Type: ", content_type,
                "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: ",
                keep_alive_ ? "keep-alive" : "close", "\r\n", HeaderLines(headers), "\r\n"),
         /*last=*/false);
  }

  void Write(std::string data) override {
    if (data.empty()) return;  // an empty chunk would end the body
    std::string chunk = StrCat(absl::Hex(data.size()), "\r\n");
    chunk += data;
    chunk += "\r\n";
    Send(std::move(chunk), /*last=*/false);
  }

  void End() override { Send("0\r\n\r\n", /*last=*/true); }

  void Post(std::function<void()> work) override {
    std::shared_ptr<SessionBase> session = LiveSession();
    if (session == nullptr) return;
    session->Dispatch([session, this_exchange = this, work = std::move(work)] {
      if (session->IsCurrent(this_exchange)) work();
    });
  }

  void OnClientGone(std::function<void(bool slow_reader)> callback) override {
    bool run_now = false, slow = false;
    {
      absl::MutexLock lock(&mu_);
      if (gone_) {
        run_now = true;
        slow = slow_reader_;
      } else if (!complete_) {
        callbacks_.push_back(std::move(callback));
      }
    }
    if (run_now) callback(slow);
  }

  // The session's side: the client went away (callbacks run here), or the
  // response was written whole (callbacks are dropped).
  void MarkGone(bool slow_reader) {
    std::vector<std::function<void(bool)>> callbacks;
    {
      absl::MutexLock lock(&mu_);
      if (gone_ || complete_) return;
      gone_ = true;
      slow_reader_ = slow_reader;
      callbacks.swap(callbacks_);
    }
    for (auto& callback : callbacks) callback(slow_reader);
  }
  void MarkComplete() {
    absl::MutexLock lock(&mu_);
    complete_ = true;
    callbacks_.clear();
  }

 private:
  std::shared_ptr<SessionBase> LiveSession() const {
    {
      absl::MutexLock lock(&mu_);
      if (gone_ || complete_) return nullptr;
    }
    std::shared_ptr<HttpServer::Impl> server = server_.lock();
    if (server == nullptr || !server->running()) return nullptr;
    return session_.lock();
  }

  void Send(std::string bytes, bool last) {
    std::shared_ptr<SessionBase> session = LiveSession();
    if (session == nullptr) return;
    // The server is held while posting: its io_context must not go away
    // under the post.
    std::shared_ptr<HttpServer::Impl> server = server_.lock();
    if (server == nullptr) return;
    session->Dispatch([session, this_exchange = this, bytes = std::move(bytes), last]() mutable {
      session->Enqueue(this_exchange, std::move(bytes), last);
    });
  }

  const std::weak_ptr<HttpServer::Impl> server_;
  const std::weak_ptr<SessionBase> session_;
  const bool keep_alive_;
  mutable absl::Mutex mu_;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  bool slow_reader_ ABSL_GUARDED_BY(mu_) = false;
  bool complete_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::function<void(bool)>> callbacks_ ABSL_GUARDED_BY(mu_);
};

// One connection. `Stream` is beast::tcp_stream or an ssl_stream over one.
template <class Stream>
class Session final : public SessionBase {
 public:
  Session(Stream stream, HttpServer::Impl* server, std::weak_ptr<HttpServer::Impl> server_ref)
      : stream_(std::move(stream)), server_(server), server_ref_(std::move(server_ref)) {
    server_->connections().fetch_add(1);
  }
  ~Session() override { server_->connections().fetch_sub(1); }

  void Run() {
    if constexpr (kTls) {
      Lowest().expires_after(ToChrono(server_->options().idle_timeout));
      stream_.async_handshake(ssl::stream_base::server, [self = Self()](beast::error_code ec) {
        if (ec) return self->Close(/*graceful=*/false);
        self->ReadRequest();
      });
    } else {
      ReadRequest();
    }
  }

  void Dispatch(std::function<void()> work) override {
    net::dispatch(stream_.get_executor(), std::move(work));
  }

  bool IsCurrent(const HttpExchange* exchange) const override {
    return exchange_ != nullptr && exchange_.get() == exchange && !closed_;
  }

  void Enqueue(const HttpExchange* from, std::string bytes, bool last) override {
    if (!IsCurrent(from) || end_queued_) return;
    out_.push_back(std::move(bytes));
    end_queued_ = last;
    if (!writing_) WriteNext();
  }

 private:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  std::shared_ptr<Session> Self() { return std::static_pointer_cast<Session>(shared_from_this()); }
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  void ReadRequest() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(static_cast<uint64_t>(server_->options().max_body_bytes));
    parser_->header_limit(static_cast<uint32_t>(server_->options().max_header_bytes));
    Lowest().expires_after(ToChrono(server_->options().idle_timeout));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = Self()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    // Clients that wait for "100 Continue" before sending a body get it.
    const auto expect = parser_->get().find(http::field::expect);
    if (expect != parser_->get().end() && beast::iequals(expect->value(), "100-continue")) {
      continue_ = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(continue_),
                       [self = Self()](beast::error_code write_ec, size_t) {
                         if (write_ec) return self->Close(/*graceful=*/false);
                         self->ReadBody();
                       });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = Self()](beast::error_code ec, size_t) { self->OnRequest(ec); });
  }

  void OnReadError(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      return SendErrorAndClose(413, StrCat("body: larger than the limit of ",
                                           server_->options().max_body_bytes, " bytes"));
    }
    if (ec == http::error::header_limit) {
      return SendErrorAndClose(431, StrCat("headers: larger than the limit of ",
                                           server_->options().max_header_bytes, " bytes"));
    }
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset ||
        ec == net::error::eof || ec.category() == net::error::get_ssl_category() ||
        ec == ssl::error::stream_truncated) {
      return Close(/*graceful=*/false);
    }
    SendErrorAndClose(400, "the request is not valid HTTP/1.1");
  }

  void SendErrorAndClose(int status, std::string_view message) {
    continue_ = ErrorResponse(status, message, /*keep_alive=*/false);
    Lowest().expires_after(ToChrono(absl::Seconds(5)));
    net::async_write(stream_, net::buffer(continue_),
                     [self = Self()](beast::error_code, size_t) { self->Close(true); });
  }

  void OnRequest(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    Lowest().expires_never();
    http::request<http::string_body> message = parser_->release();
    parser_.reset();
    HttpRequest request;
    request.method = std::string(message.method_string());
    request.target = std::string(message.target());
    for (const auto& field : message) {
      request.headers.emplace_back(absl::AsciiStrToLower(absl::string_view(
                                       field.name_string().data(), field.name_string().size())),
                                   std::string(field.value()));
    }
    request.body = std::move(message.body());
    keep_alive_ = message.keep_alive() && server_->running();
    auto exchange = std::make_shared<Exchange>(server_ref_, weak_from_this(), keep_alive_);
    exchange_ = exchange;
    end_queued_ = false;
    WatchForHangUp();
    server_->handler()->Handle(std::move(request), std::move(exchange));
  }

  // Waits for the socket to turn readable while the response is pending.
  void WatchForHangUp() {
    if (watching_ || closed_) return;
    watching_ = true;
    Lowest().socket().async_wait(tcp::socket::wait_read,
                                 [self = Self()](beast::error_code ec) { self->OnReadable(ec); });
  }

  void OnReadable(beast::error_code ec) {
    watching_ = false;
    if (closed_) return;
    if (exchange_ == nullptr) {
      // The response is done: its end cancelled this wait, or the next
      // request began to arrive. Either way, read it.
      return ReadRequest();
    }
    if (ec) return;
    char byte;
    const ssize_t n = ::recv(Lowest().socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return ClientGone(/*slow_reader=*/false);
    }
    // Bytes of a pipelined request: nothing more to learn from the socket
    // until it is read. A spurious wake-up: wait again.
    if (n < 0) WatchForHangUp();
  }

  void WriteNext() {
    in_flight_.clear();
    for (std::string& piece : out_) in_flight_ += piece;
    out_.clear();
    writing_ = true;
    const absl::Duration timeout = server_->options().write_timeout;
    if (timeout > absl::ZeroDuration()) {
      Lowest().expires_after(ToChrono(timeout));
    } else {
      Lowest().expires_never();
    }
    const bool last = end_queued_;
    net::async_write(
        stream_, net::buffer(in_flight_),
        [self = Self(), last](beast::error_code ec, size_t) { self->OnWritten(ec, last); });
  }

  void OnWritten(beast::error_code ec, bool last) {
    writing_ = false;
    // The hang-up watch may have run first (the client read its answer and
    // left): the connection is closed and the exchange ended already.
    if (closed_) return;
    if (ec) return ClientGone(/*slow_reader=*/ec == beast::error::timeout);
    Lowest().expires_never();
    if (!out_.empty()) return WriteNext();
    if (last) ResponseDone();
  }

  void ResponseDone() {
    if (exchange_ != nullptr) static_cast<Exchange*>(exchange_.get())->MarkComplete();
    exchange_.reset();
    if (!keep_alive_) return Close(/*graceful=*/true);
    if (watching_) {
      // OnReadable reads the next request once the wait ends.
      beast::error_code ignored;
      Lowest().socket().cancel(ignored);
      return;
    }
    ReadRequest();
  }

  void ClientGone(bool slow_reader) {
    if (exchange_ != nullptr) {
      std::shared_ptr<HttpExchange> exchange = std::move(exchange_);
      static_cast<Exchange*>(exchange.get())->MarkGone(slow_reader);
    }
    out_.clear();
    Close(/*graceful=*/false);
  }

  void Close(bool graceful) {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    if constexpr (kTls) {
      if (graceful) {
        Lowest().expires_after(ToChrono(absl::Seconds(5)));
        stream_.async_shutdown([self = Self()](beast::error_code) {
          beast::error_code e;
          self->Lowest().socket().close(e);
        });
        return;
      }
    } else if (graceful) {
      Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    }
    Lowest().socket().close(ignored);
  }

  Stream stream_;
  HttpServer::Impl* const server_;  // outlives every session (they die with its io_context)
  const std::weak_ptr<HttpServer::Impl> server_ref_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<HttpExchange> exchange_;  // the request being answered
  std::deque<std::string> out_;
  std::string in_flight_;
  std::string continue_;
  bool writing_ = false;
  bool end_queued_ = false;
  bool keep_alive_ = true;
  bool watching_ = false;
  bool closed_ = false;
};

}  // namespace

std::string_view HttpRequest::Header(std::string_view lower_case_name) const {
  std::string_view found;
  for (const auto& [name, value] : headers) {
    if (name == lower_case_name) found = value;
  }
  return found;
}

absl::Status HttpServer::Impl::Listen() {
  if (!options_.tls_cert_file.empty() || !options_.tls_key_file.empty()) {
    try {
      tls_.emplace(ssl::context::tls_server);
      tls_->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                        ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
      tls_->use_certificate_chain_file(options_.tls_cert_file);
      tls_->use_private_key_file(options_.tls_key_file, ssl::context::pem);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          StrCat("--tls_cert_file/--tls_key_file: cannot be used for HTTPS: ", e.what()));
    }
  }
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(options_.host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        StrCat("--http_listen: \"", options_.host, "\" is not an IP address"));
  }
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(options_.port));
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::InvalidArgumentError(StrCat("--http_port: cannot listen on ", options_.host, ":",
                                             options_.port, ": ", ec.message()));
  }
  port_ = acceptor_.local_endpoint().port();
  return absl::OkStatus();
}

template <class Stream>
void HttpServer::Impl::StartSession(Stream stream) {
  // Sessions hold the server by raw pointer (it outlives them) and weakly
  // for their exchanges.
  auto session = std::make_shared<Session<Stream>>(std::move(stream), this, self);
  session->Run();
}

void HttpServer::Impl::Accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !running()) return;
    if (!ec) {
      if (connections_.load() >= options_.max_connections) {
        // Over the limit: say so (plain HTTP only) and hang up.
        if (!tls_.has_value()) {
          const std::string refusal = ErrorResponse(503, "too many open connections", false);
          beast::error_code ignored;
          socket.non_blocking(true, ignored);
          net::write(socket, net::buffer(refusal), ignored);
        }
        beast::error_code ignored;
        socket.close(ignored);
      } else if (tls_.has_value()) {
        StartSession(
            beast::ssl_stream<beast::tcp_stream>(beast::tcp_stream(std::move(socket)), *tls_));
      } else {
        StartSession(beast::tcp_stream(std::move(socket)));
      }
    }
    Accept();
  });
}

void HttpServer::Impl::Run(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) {
    threads_.emplace_back([this] {
      NameThisThread("tandem-http");
      ioc_.run();
    });
  }
}

void HttpServer::Impl::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  running_.store(false);
  net::post(ioc_, [this] {
    beast::error_code ignored;
    acceptor_.close(ignored);
  });
  ioc_.stop();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler* handler) {
  auto impl = std::make_shared<Impl>(options, handler);
  impl->self = impl;
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  impl->Accept();
  impl->Run(options.threads);
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::~HttpServer() { Shutdown(); }

void HttpServer::Shutdown() { impl_->Shutdown(); }
int HttpServer::port() const { return impl_->port(); }
int64_t HttpServer::open_connections() const { return impl_->connections().load(); }

}  // namespace tandem::server
