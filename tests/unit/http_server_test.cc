// The HTTP server (server/http_server.h) over raw sockets: keep-alive and
// pipelining, chunked streams, the limits a client controls (413, 431, the
// connection cap), 100-continue, and the hang-up and slow-reader signals
// that cancel a request. Waits are on observable state with deadlines.
#include "server/http_server.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace tandem::server {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Answers by path: /echo the body, /stream three chunks, /hold nothing until
// told (it keeps the exchange), /big a large streamed body.
class TestHandler final : public HttpHandler {
 public:
  void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) override {
    if (request.target == "/echo") {
      exchange->Respond(200, "text/plain", request.method + " " + request.body,
                        {{"X-Seen-Header", std::string(request.Header("x-test"))}});
    } else if (request.target == "/stream") {
      exchange->StartStream(200, "text/event-stream");
      for (const char* piece : {"one ", "two ", "three"}) exchange->Write(piece);
      exchange->End();
    } else if (request.target == "/hold" || request.target == "/big") {
      exchange->OnClientGone(
          [this](bool slow_reader) { (slow_reader ? slow_readers_ : hang_ups_).fetch_add(1); });
      if (request.target == "/big") {
        exchange->StartStream(200, "application/octet-stream");
        for (int i = 0; i < 64; ++i) exchange->Write(std::string(1 << 20, 'x'));
      }
      absl::MutexLock lock(&mu_);
      held_.push_back(std::move(exchange));
    } else {
      exchange->Respond(404, "text/plain", "no");
    }
  }

  // Answers every held exchange (after the server is gone: dropped).
  void RespondToHeld() {
    absl::MutexLock lock(&mu_);
    for (auto& exchange : held_) exchange->Respond(200, "text/plain", "late");
  }

  int held() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(held_.size());
  }
  std::atomic<int> hang_ups_{0};
  std::atomic<int> slow_readers_{0};

 private:
  absl::Mutex mu_;
  std::vector<std::shared_ptr<HttpExchange>> held_;
};

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void Send(int fd, const std::string& bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

// Reads until `done(received)` or the connection closes or 10 s pass.
std::string ReadUntil(int fd, const std::function<bool(const std::string&)>& done) {
  std::string received;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done(received) && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buffer[4096];
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    received.append(buffer, static_cast<size_t>(n));
  }
  return received;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

bool WaitFor(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(HttpServerOptions options = {}) {
    options.host = "127.0.0.1";
    options.port = 0;
    absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(options, &handler_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  TestHandler handler_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, KeepAliveServesSeveralRequestsOnOneConnectionInOrder) {
  Start();
  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  Send(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nX-Test: yes\r\nContent-Length: 5\r\n\r\nhello");
  std::string first = ReadUntil(fd, [](const std::string& r) { return r.find("hello") != r.npos; });
  EXPECT_THAT(first, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(first, HasSubstr("Content-Length: 10\r\n"));
  EXPECT_THAT(first, HasSubstr("Connection: keep-alive\r\n"));
  EXPECT_THAT(first, HasSubstr("X-Seen-Header: yes\r\n"));
  // Two pipelined requests, answered in order on the same connection.
  Send(fd,
       "GET /echo HTTP/1.1\r\nHost: x\r\n\r\nGET /stream HTTP/1.1\r\nHost: x\r\n"
       "Connection: close\r\n\r\n");
  const std::string rest = ReadUntil(fd, [](const std::string&) { return false; });
  EXPECT_EQ(Count(rest, "HTTP/1.1 200 OK"), 2u) << rest;
  EXPECT_LT(rest.find("GET "), rest.find("Transfer-Encoding: chunked"));
  // The chunks, then the last chunk; the server closes as asked.
  EXPECT_THAT(rest, HasSubstr("\r\n\r\n4\r\none \r\n4\r\ntwo \r\n5\r\nthree\r\n0\r\n\r\n"));
  ::close(fd);
}

TEST_F(HttpServerTest, ABodyOverTheLimitIs413AndHeadersOverTheirsAre431) {
  HttpServerOptions options;
  options.max_body_bytes = 100;
  options.max_header_bytes = 1024;
  Start(options);
  int fd = Connect(server_->port());
  Send(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n");
  std::string response = ReadUntil(fd, [](const std::string&) { return false; });
  EXPECT_THAT(response, StartsWith("HTTP/1.1 413 "));
  EXPECT_THAT(response, HasSubstr("larger than the limit of 100 bytes"));
  ::close(fd);
  fd = Connect(server_->port());
  Send(fd, "GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(2000, 'a') + "\r\n\r\n");
  response = ReadUntil(fd, [](const std::string&) { return false; });
  EXPECT_THAT(response, StartsWith("HTTP/1.1 431 "));
  ::close(fd);
  fd = Connect(server_->port());
  Send(fd, "NOT HTTP AT ALL\r\n\r\n");
  EXPECT_THAT(ReadUntil(fd, [](const std::string&) { return false; }), StartsWith("HTTP/1.1 400 "));
  ::close(fd);
}

TEST_F(HttpServerTest, ExpectContinueGetsA100BeforeTheBody) {
  Start();
  const int fd = Connect(server_->port());
  Send(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  const std::string interim =
      ReadUntil(fd, [](const std::string& r) { return r.find("\r\n\r\n") != r.npos; });
  EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
  Send(fd, "ok");
  EXPECT_THAT(ReadUntil(fd, [](const std::string& r) { return r.find("POST ok") != r.npos; }),
              HasSubstr("POST ok"));
  ::close(fd);
}

TEST_F(HttpServerTest, OverTheConnectionCapANewConnectionGets503) {
  HttpServerOptions options;
  options.max_connections = 2;
  Start(options);
  const int a = Connect(server_->port()), b = Connect(server_->port());
  ASSERT_TRUE(WaitFor([&] { return server_->open_connections() == 2; }));
  const int c = Connect(server_->port());
  EXPECT_THAT(ReadUntil(c, [](const std::string&) { return false; }), StartsWith("HTTP/1.1 503 "));
  ::close(c);
  ::close(a);
  ASSERT_TRUE(WaitFor([&] { return server_->open_connections() == 1; }));
  const int d = Connect(server_->port());
  Send(d, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(ReadUntil(d, [](const std::string& r) { return r.find("GET ") != r.npos; }),
              StartsWith("HTTP/1.1 200 "));
  ::close(b);
  ::close(d);
}

TEST_F(HttpServerTest, AClientThatHangsUpIsReportedGoneAtOnce) {
  Start();
  const int fd = Connect(server_->port());
  Send(fd, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(WaitFor([&] { return handler_.held() == 1; }));
  EXPECT_EQ(handler_.hang_ups_.load(), 0);
  ::close(fd);
  EXPECT_TRUE(WaitFor([&] { return handler_.hang_ups_.load() == 1; }));
  EXPECT_TRUE(WaitFor([&] { return server_->open_connections() == 0; }));
  EXPECT_EQ(handler_.slow_readers_.load(), 0);
}

TEST_F(HttpServerTest, AClientThatStopsReadingIsReportedAsASlowReader) {
  HttpServerOptions options;
  options.write_timeout = absl::Milliseconds(300);
  Start(options);
  const int fd = Connect(server_->port());
  const int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  Send(fd, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n");
  // 64 MiB that nobody reads: the write waits, then times out.
  EXPECT_TRUE(WaitFor([&] { return handler_.slow_readers_.load() == 1; }));
  EXPECT_EQ(handler_.hang_ups_.load(), 0);
  ::close(fd);
}

TEST_F(HttpServerTest, ExchangesOutlivingTheServerDropTheirOutput) {
  Start();
  const int fd = Connect(server_->port());
  Send(fd, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(WaitFor([&] { return handler_.held() == 1; }));
  server_->Shutdown();
  server_.reset();
  // The handler still holds the exchange; answering it now is dropped.
  handler_.RespondToHeld();
  EXPECT_EQ(ReadUntil(fd, [](const std::string&) { return false; }), "");
  ::close(fd);
}

TEST(HttpServerStartTest, AnAddressInUseIsInvalidArgumentNamingTheFlag) {
  TestHandler handler;
  HttpServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  absl::StatusOr<std::unique_ptr<HttpServer>> first = HttpServer::Start(options, &handler);
  ASSERT_TRUE(first.ok());
  options.port = (*first)->port();
  absl::StatusOr<std::unique_ptr<HttpServer>> second = HttpServer::Start(options, &handler);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(second.status()));
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("--http_port"));
  options.host = "not-an-address";
  options.port = 0;
  EXPECT_THAT(std::string(HttpServer::Start(options, &handler).status().message()),
              HasSubstr("not an IP address"));
}

}  // namespace
}  // namespace tandem::server
