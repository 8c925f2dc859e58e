// HttpTransport on its own (no cluster): what a careless or hostile client
// meets. Raw sockets, because client libraries hide exactly what is tested
// here (pipelining, HTTP/1.0, slow and idle connections, the connection bound).
#include "coordinator/http/http_transport.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {
namespace {

using Clock = std::chrono::steady_clock;

// A blocking client socket with a receive timeout.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~RawClient() {
    if (fd_ >= 0) close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient(RawClient&& o) noexcept : fd_(o.fd_), connected_(o.connected_) { o.fd_ = -1; }

  bool connected() const { return connected_; }
  bool Send(const std::string& data) {
    return ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // Reads until `done(text)` holds, EOF, or `timeout`; sets eof() on EOF.
  std::string ReadUntil(const std::function<bool(const std::string&)>& done,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    const auto end = Clock::now() + timeout;
    while (!done(in_)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[65536];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        eof_ = true;
        break;
      }
      in_.append(buf, static_cast<size_t>(n));
    }
    return in_;
  }
  std::string ReadToEof(std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    return ReadUntil([](const std::string&) { return false; }, timeout);
  }
  bool eof() const { return eof_; }
  std::string& text() { return in_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string in_;
};

// The number of complete responses (with Content-Length bodies) in `text`.
int WholeResponses(const std::string& text) {
  int n = 0;
  size_t pos = 0;
  while (true) {
    const size_t head_end = text.find("\r\n\r\n", pos);
    if (head_end == std::string::npos) return n;
    const size_t cl = text.find("Content-Length: ", pos);
    if (cl == std::string::npos || cl > head_end) return n;
    const size_t len = std::stoul(text.substr(cl + 16));
    if (text.size() < head_end + 4 + len) return n;
    ++n;
    pos = head_end + 4 + len;
  }
}

class HttpTransportTest : public ::testing::Test {
 protected:
  void Start(HttpTransportOptions o = {}) {
    o.listen = "127.0.0.1:0";
    auto t = HttpTransport::Create(o);
    ASSERT_TRUE(t.ok()) << t.status();
    transport_ = *std::move(t);
    transport_->Get("/health", [](const HttpRequest&, HttpResponse& res) {
      res.set_content("ok", "text/plain");
    });
    transport_->Get(R"(/items/(.+))", [](const HttpRequest& req, HttpResponse& res) {
      res.set_content("item " + req.matches[1], "text/plain");
    });
    transport_->Post("/echo", [](const HttpRequest& req, HttpResponse& res) {
      res.set_content(req.body, "text/plain");
    });
    // A stream of `n` events, one every 20 ms, from a timer (no thread waits).
    transport_->Post(
        "/stream", HttpTransport::AsyncHandler([this](std::shared_ptr<HttpExchange> ex) {
          const int n = std::stoi(ex->request().body.empty() ? "3" : ex->request().body);
          HttpResponse head;
          head.content_type = "text/event-stream";
          ex->BeginStream(head);
          ex->OnClientGone([this] { ++gone_; });
          Tick(ex, 0, n);
        }));
    // Keeps the exchange unanswered, for the test to use later.
    transport_->Post("/hold", HttpTransport::AsyncHandler([this](std::shared_ptr<HttpExchange> ex) {
                       std::lock_guard<std::mutex> l(held_mu_);
                       held_ = std::move(ex);
                     }));
    transport_->set_logger([this](const HttpRequest&, const HttpResponse&, bool complete) {
      ++(complete ? logged_complete_ : logged_incomplete_);
    });
    transport_->Start();
    port_ = transport_->port();
  }
  static void Tick(const std::shared_ptr<HttpExchange>& ex, int i, int n) {
    if (i == n) {
      ex->Write("data: [DONE]\n\n");
      ex->End();
      return;
    }
    ex->Write(absl::StrCat("data: ", i, "\n\n"));
    ex->After(absl::Milliseconds(20), [ex, i, n] { Tick(ex, i + 1, n); });
  }
  // 400 events of 8 KiB, one every millisecond, then the end.
  static void Flood(const std::shared_ptr<HttpExchange>& ex, int i) {
    if (i == 400) {
      ex->Write("data: [DONE]\n\n");
      ex->End();
      return;
    }
    ex->Write(absl::StrCat("data: ", std::string(8 << 10, 'x'), "\n\n"));
    ex->After(absl::Milliseconds(1), [ex, i] { Flood(ex, i + 1); });
  }
  void TearDown() override {
    if (transport_) transport_->Stop();
  }

  std::unique_ptr<HttpTransport> transport_;
  int port_ = 0;
  std::atomic<int> gone_{0}, logged_complete_{0}, logged_incomplete_{0};
  std::shared_ptr<HttpExchange> Held() {
    std::lock_guard<std::mutex> l(held_mu_);
    return held_;
  }
  std::mutex held_mu_;
  std::shared_ptr<HttpExchange> held_;  // under held_mu_
};

TEST_F(HttpTransportTest, PipelinedRequestsAreAnsweredInOrder) {
  Start();
  RawClient c(port_);
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(
      c.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
             "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
             "GET /items/42 HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string text = c.ReadUntil([](const std::string& t) { return WholeResponses(t) == 3; });
  ASSERT_EQ(WholeResponses(text), 3) << text;
  const size_t a = text.find("\r\n\r\nok"), b = text.find("\r\n\r\nhello"),
               d = text.find("item 42");
  EXPECT_TRUE(a < b && b < d) << text;
  EXPECT_FALSE(c.eof());  // kept alive
}

// A request that arrives while the one before it is being answered waits in
// the connection's buffer, and the connection keeps reading meanwhile. Taking
// that request out of the buffer must not move where the read still under way
// puts the next request's bytes: the request after it is answered as sent,
// whether shorter or longer than the one that waited (not seen as an
// unfinished head, 408, nor as the waiting request again).
TEST_F(HttpTransportTest, ARequestAfterOneThatWaitedInTheBufferIsReadAsSent) {
  HttpTransportOptions o;
  o.connections.header_timeout = absl::Milliseconds(300);
  Start(o);
  const std::string waited =
      "GET /items/one-that-waited-behind-the-first HTTP/1.1\r\nHost: x\r\n\r\n";
  for (const std::string& next : {std::string("short"), std::string(200, 'l')}) {
    RawClient c(port_);
    ASSERT_TRUE(c.connected());
    // The second request is in the buffer while the first is answered.
    ASSERT_TRUE(c.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + waited));
    std::string text = c.ReadUntil([](const std::string& t) { return WholeResponses(t) == 2; });
    ASSERT_EQ(WholeResponses(text), 2) << text;
    ASSERT_NE(text.find("item one-that-waited-behind-the-first"), std::string::npos) << text;
    c.text().clear();
    // Sent only once both answers are in: the read for it was issued before
    // the waiting request was taken out of the buffer.
    ASSERT_TRUE(c.Send(absl::StrCat("GET /items/", next, " HTTP/1.1\r\nHost: x\r\n\r\n")));
    text = c.ReadUntil([](const std::string& t) { return WholeResponses(t) >= 1; });
    ASSERT_GE(WholeResponses(text), 1) << text;
    EXPECT_TRUE(absl::StartsWith(text, "HTTP/1.1 200")) << next.size() << ": " << text;
    EXPECT_NE(text.find("\r\n\r\nitem " + next), std::string::npos) << next.size() << ": " << text;
  }
}

TEST_F(HttpTransportTest, WrongMethodIs405WithAllowAndUnknownPathIs404) {
  Start();
  RawClient c(port_);
  ASSERT_TRUE(c.Send("DELETE /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string text = c.ReadUntil([](const std::string& t) { return WholeResponses(t) == 1; });
  EXPECT_TRUE(absl::StartsWith(text, "HTTP/1.1 405")) << text;
  EXPECT_NE(text.find("Allow: GET, HEAD"), std::string::npos) << text;
  RawClient d(port_);
  ASSERT_TRUE(
      d.Send("GET /echo HTTP/1.1\r\nHost: x\r\n\r\nGET /nothing HTTP/1.1\r\nHost: x\r\n\r\n"));
  text = d.ReadUntil([](const std::string& t) { return WholeResponses(t) == 2; });
  EXPECT_TRUE(absl::StartsWith(text, "HTTP/1.1 405")) << text;
  EXPECT_NE(text.find("Allow: POST"), std::string::npos) << text;
  EXPECT_NE(text.find("HTTP/1.1 404"), std::string::npos) << text;
}

TEST_F(HttpTransportTest, StreamsAreChunkedForHttp11AndCloseDelimitedForHttp10) {
  Start();
  {
    RawClient c(port_);
    ASSERT_TRUE(c.Send("POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n3"));
    const std::string text =
        c.ReadUntil([](const std::string& t) { return absl::StrContains(t, "0\r\n\r\n"); });
    EXPECT_NE(text.find("Transfer-Encoding: chunked"), std::string::npos) << text;
    EXPECT_NE(text.find("data: [DONE]"), std::string::npos) << text;
    EXPECT_FALSE(c.eof());
    // The connection goes on with the next request.
    ASSERT_TRUE(c.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_NE(c.ReadUntil([](const std::string& t) {
                 return absl::StrContains(t, "\r\n\r\nok");
               }).find("\r\n\r\nok"),
              std::string::npos);
  }
  RawClient c(port_);
  ASSERT_TRUE(c.Send("POST /stream HTTP/1.0\r\nContent-Length: 1\r\n\r\n3"));
  const std::string text = c.ReadToEof();
  EXPECT_TRUE(c.eof()) << text;
  EXPECT_EQ(text.find("Transfer-Encoding"), std::string::npos) << text;
  EXPECT_NE(text.find("Connection: close"), std::string::npos) << text;
  EXPECT_TRUE(absl::EndsWith(text, "data: 2\n\ndata: [DONE]\n\n")) << text;
}

TEST_F(HttpTransportTest, Http10KeepsAliveOnlyWhenAsked) {
  Start();
  RawClient once(port_);
  ASSERT_TRUE(once.Send("GET /health HTTP/1.0\r\n\r\n"));
  once.ReadToEof();
  EXPECT_TRUE(once.eof());
  RawClient kept(port_);
  ASSERT_TRUE(kept.Send("GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  const std::string text =
      kept.ReadUntil([](const std::string& t) { return WholeResponses(t) == 1; });
  EXPECT_NE(text.find("Connection: keep-alive"), std::string::npos) << text;
  kept.ReadUntil([](const std::string&) { return false; }, std::chrono::milliseconds(200));
  EXPECT_FALSE(kept.eof());
}

TEST_F(HttpTransportTest, ConnectionCloseIsHonoured) {
  Start();
  RawClient c(port_);
  ASSERT_TRUE(c.Send("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string text = c.ReadToEof();
  EXPECT_TRUE(c.eof());
  EXPECT_NE(text.find("Connection: close"), std::string::npos) << text;
}

TEST_F(HttpTransportTest, SlowHeadsAndBodiesGet408AndIdleConnectionsClose) {
  HttpTransportOptions o;
  o.connections.header_timeout = absl::Milliseconds(300);
  o.connections.idle_timeout = absl::Milliseconds(300);
  o.connections.body_timeout = absl::Milliseconds(300);
  Start(o);
  RawClient slow_body(port_);  // a whole head, then 3 of the 10 bytes it promised
  ASSERT_TRUE(slow_body.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"));
  EXPECT_TRUE(
      absl::StartsWith(slow_body.ReadToEof(std::chrono::milliseconds(3000)), "HTTP/1.1 408"));
  EXPECT_TRUE(slow_body.eof());
  RawClient slow(port_);
  ASSERT_TRUE(slow.Send("GET /health HTTP/1.1\r\nHost: x\r\n"));  // never ends its head
  // 10x the header timeout: the server ends it, not our wait.
  const std::string text = slow.ReadToEof(std::chrono::milliseconds(3000));
  EXPECT_TRUE(slow.eof());
  EXPECT_TRUE(absl::StartsWith(text, "HTTP/1.1 408")) << text;
  RawClient idle(port_);  // connects and says nothing
  idle.ReadToEof(std::chrono::milliseconds(3000));
  EXPECT_TRUE(idle.eof());
  // Kept alive after a request, then idle: closed without a word.
  RawClient kept(port_);
  ASSERT_TRUE(kept.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string answered = kept.ReadToEof(std::chrono::milliseconds(3000));
  EXPECT_TRUE(kept.eof());
  EXPECT_EQ(WholeResponses(answered), 1) << answered;
}

TEST_F(HttpTransportTest, ConnectionsPastTheBoundGet503) {
  HttpTransportOptions o;
  o.connections.max_connections = 8;
  Start(o);
  std::vector<RawClient> held;
  for (int i = 0; i < 8; ++i) {
    held.emplace_back(port_);
    ASSERT_TRUE(held.back().Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    held.back().ReadUntil([](const std::string& t) { return WholeResponses(t) == 1; });
  }
  RawClient extra(port_);
  const std::string text = extra.ReadToEof();
  EXPECT_TRUE(absl::StartsWith(text, "HTTP/1.1 503")) << text;
  EXPECT_NE(text.find("Retry-After"), std::string::npos) << text;
  held.clear();
  // Room again once they are gone.
  bool served = false;
  for (int i = 0; i < 50 && !served; ++i) {
    RawClient again(port_);
    again.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    served = absl::StartsWith(
        again.ReadUntil([](const std::string& t) { return WholeResponses(t) == 1; }),
        "HTTP/1.1 200");
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(served);
}

TEST_F(HttpTransportTest, LargeBodyIs413BeforeItIsRead) {
  HttpTransportOptions o;
  o.max_body_bytes = 1000;
  Start(o);
  RawClient c(port_);
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"));
  ASSERT_TRUE(
      c.Send(std::string(50000, 'a')));  // the client goes on sending; it still reads the answer
  const std::string text = c.ReadToEof();
  EXPECT_TRUE(absl::StartsWith(text, "HTTP/1.1 413")) << text;
  EXPECT_NE(text.find("Connection: close"), std::string::npos) << text;
  // With Expect: 100-continue under the limit, the body follows the 100.
  RawClient e(port_);
  ASSERT_TRUE(e.Send(
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"));
  EXPECT_TRUE(absl::StartsWith(e.ReadUntil([](const std::string& t) {
    return absl::StrContains(t, "100 Continue\r\n\r\n");
  }),
                               "HTTP/1.1 100 Continue"));
  ASSERT_TRUE(e.Send("abc"));
  EXPECT_TRUE(absl::EndsWith(
      e.ReadUntil([](const std::string& t) { return absl::EndsWith(t, "abc"); }), "abc"));
}

TEST_F(HttpTransportTest, AClientThatLeavesMidStreamIsNoticed) {
  Start();
  {
    RawClient c(port_);
    ASSERT_TRUE(c.Send("POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n500"));
    c.ReadUntil([](const std::string& t) { return absl::StrContains(t, "data: 1"); });
  }
  // Bounds of 10 s only keep a broken test from hanging.
  for (int i = 0; i < 1000 && gone_ == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(gone_, 1);
  for (int i = 0; i < 1000 && logged_incomplete_ == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(logged_incomplete_, 1);
  for (int i = 0; i < 1000 && transport_->connections() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(transport_->connections(), 0);
}

// Flow control (ClientBuffers): a stream whose client does not read is ended
// once over its bound past the grace (the connection closes, the handler hears
// the client is gone) and its bytes are released; a client that reads gets it
// all; what a handler holds on the exchange is released with its response.
TEST_F(HttpTransportTest, AStreamWhoseClientDoesNotReadIsEndedAtItsBound) {
  ClientBufferOptions bounds;
  bounds.max_stream_bytes = 64 << 10;
  bounds.stall_grace = absl::Milliseconds(100);
  std::shared_ptr<ClientBuffers> buffers = ClientBuffers::Create(bounds);
  HttpTransportOptions o;
  o.client_buffers = buffers;
  Start(o);
  // Counts the tokens the exchanges hold.
  struct Token {
    explicit Token(std::atomic<int>* n) : live(n) { ++*live; }
    ~Token() { --*live; }
    std::atomic<int>* live;
  };
  auto live = std::make_shared<std::atomic<int>>(0);
  transport_->Post("/flood",
                   HttpTransport::AsyncHandler([this, live](std::shared_ptr<HttpExchange> ex) {
                     ex->Hold(std::make_shared<Token>(live.get()));
                     HttpResponse head;
                     head.content_type = "text/event-stream";
                     ex->BeginStream(head);
                     ex->OnClientGone([this] { ++gone_; });
                     Flood(ex, 0);
                   }));
  {
    // Reads everything: served whole, nothing ended.
    RawClient reader(port_);
    ASSERT_TRUE(reader.Send("POST /flood HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"));
    const std::string text = reader.ReadUntil(
        [](const std::string& t) { return absl::StrContains(t, "0\r\n\r\n"); },
        std::chrono::milliseconds(30000));
    EXPECT_NE(text.find("data: [DONE]"), std::string::npos);
    EXPECT_EQ(buffers->streams_ended(), 0u);
  }
  {
    // Reads nothing: ended, and the transport lets go of everything.
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    const std::string request = "POST /flood HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()));
    for (int i = 0; i < 1000 && gone_ == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(gone_, 1);
    EXPECT_EQ(buffers->streams_ended(), 1u);
    close(fd);
  }
  for (int i = 0; i < 500 && (buffers->queued() != 0 || *live != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(buffers->queued(), 0u);
  EXPECT_EQ(*live, 0) << "an exchange's token outlived its response";
}

// A handler that asks after its client already left (a generation started
// while the client was closing) is told at once.
// A client that reads its whole answer and closes at once has had a complete
// exchange, however the server's completions of the last write and of the
// client's close are ordered.
TEST_F(HttpTransportTest, AClientThatClosesAfterItsWholeAnswerIsNotGone) {
  HttpTransportOptions o;
  o.io_threads = 2;
  Start(o);
  constexpr int kRequests = 200;
  for (int i = 0; i < kRequests; ++i) {
    RawClient c(port_);
    const bool keep_alive = i % 2 == 0;
    ASSERT_TRUE(c.Send(absl::StrCat("POST /echo HTTP/1.1\r\nHost: x\r\n",
                                    keep_alive ? "" : "Connection: close\r\n",
                                    "Content-Length: 5\r\n\r\nhello")));
    const std::string text =
        c.ReadUntil([](const std::string& t) { return WholeResponses(t) == 1; });
    ASSERT_EQ(WholeResponses(text), 1) << text;
  }  // each client closes right after its answer
  for (int i = 0; i < 500 && logged_complete_ + logged_incomplete_ < kRequests; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(logged_complete_, kRequests);
  EXPECT_EQ(logged_incomplete_, 0);
}

TEST_F(HttpTransportTest, AClientGoneBeforeTheHandlerAsksIsReported) {
  Start();
  {
    RawClient c(port_);
    ASSERT_TRUE(c.Send("POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"));
    for (int i = 0; i < 500 && !Held(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  for (int i = 0; i < 500 && logged_incomplete_ == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(logged_incomplete_, 1);  // the connection closed with the exchange open
  std::shared_ptr<HttpExchange> held = Held();
  ASSERT_NE(held, nullptr);
  held->OnClientGone([this] { ++gone_; });
  for (int i = 0; i < 500 && gone_ == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(gone_, 1);
}

TEST_F(HttpTransportTest, ManyIdleAndSlowConnectionsDoNotDelayOthers) {
  Start();
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  setrlimit(RLIMIT_NOFILE, &r);
  std::vector<RawClient> hogs;
  for (int i = 0; i < 300; ++i) {
    hogs.emplace_back(port_);
    if (i % 3 == 0) hogs.back().Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Le");
  }
  // The hogs never finish: a server that gave each connection a thread (or
  // waited on them in turn) would not answer while they stay open.
  RawClient c(port_);
  ASSERT_TRUE(c.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string text = c.ReadUntil([](const std::string& t) { return WholeResponses(t) == 1; });
  EXPECT_TRUE(absl::StartsWith(text, "HTTP/1.1 200")) << text;
}

}  // namespace
}  // namespace flotilla::coordinator
