#include "coordinator/http/http_transport.h"

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <map>
#include <regex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/listen_address.h"
#include "spdlog/spdlog.h"

namespace flotilla::coordinator {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using ErrorCode = boost::system::error_code;

// ---- requests ----

namespace {
bool SameName(std::string_view a, std::string_view b) {
  return absl::EqualsIgnoreCase(absl::string_view(a.data(), a.size()),
                                absl::string_view(b.data(), b.size()));
}
}  // namespace

bool HttpRequest::has_header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (SameName(k, name)) return true;
  }
  return false;
}

std::string HttpRequest::get_header_value(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (SameName(k, name)) return v;
  }
  return "";
}

namespace {

constexpr size_t kReadChunk = 16 << 10;
constexpr size_t kHeaderLimit = 64 << 10;
// Bytes a client may pipeline behind the request being answered before the
// connection stops reading (and so stops noticing a close) until the answer.
constexpr size_t kPipelineLimit = 1 << 20;
// Output a stream may queue for a client that does not read before the
// connection is given up, when the transport has no ClientBuffers.
constexpr size_t kMaxQueuedOutput = 64 << 20;
// What Linux's send-buffer autotuning reaches by default (tcp_wmem's maximum).
constexpr size_t kAutotunedSendBuffer = 4 << 20;
// A write buffer larger than this is freed once written, not kept for the
// connection's next response.
constexpr size_t kKeptBufferBytes = 256 << 10;
// How long a connection closing after an early answer drops what the client
// still sends, so that the client reads the answer instead of a reset.
constexpr absl::Duration kLinger = absl::Seconds(5);
// Connections being refused (503, too many connections) at once; past it
// they are closed without an answer.
constexpr int kMaxRefusing = 256;

std::string StatusLine(int status) {
  const auto reason = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  return absl::StrCat(
      "HTTP/1.1 ", status, " ",
      reason.empty() ? std::string("Unknown") : std::string(reason.data(), reason.size()), "\r\n");
}

// The response head: status line, content type, the handler's headers, the
// framing and the connection header.
std::string ResponseHead(const HttpResponse& res, std::optional<size_t> length, bool chunked,
                         bool close, bool keep_alive_header) {
  std::string head = StatusLine(res.status);
  if (!res.content_type.empty()) absl::StrAppend(&head, "Content-Type: ", res.content_type, "\r\n");
  for (const auto& [k, v] : res.headers) absl::StrAppend(&head, k, ": ", v, "\r\n");
  if (length) absl::StrAppend(&head, "Content-Length: ", *length, "\r\n");
  if (chunked) head += "Transfer-Encoding: chunked\r\n";
  if (close) {
    head += "Connection: close\r\n";
  } else if (keep_alive_header) {
    head += "Connection: keep-alive\r\n";
  }
  head += "\r\n";
  return head;
}

}  // namespace

// Named rather than anonymous: HttpTransport::Impl holds these, and a class
// of external linkage holding an anonymous type is what gcc refuses
// (-Wsubobject-linkage) once this file is compiled in a unity batch.
namespace http_transport_detail {

// A fixed set of threads running queued tasks.
class WorkPool {
 public:
  void Start(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  void Submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  // Finishes the running tasks, drops the queued ones.
  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      tasks_.clear();
    }
    cv_.notify_all();
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return stop_ || !tasks_.empty(); });
        if (stop_) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

struct Route {
  std::string method;
  std::regex pattern;
  HttpTransport::Handler handler;
  HttpTransport::AsyncHandler async;
};

// What outlives the transport while connections still hold it: the I/O
// context their sockets belong to.
struct IoShared {
  explicit IoShared(int threads) : io(threads) {}
  asio::io_context io;
  std::atomic<int> open{0};
  std::atomic<int> refusing{0};
  std::atomic<int> busy{0};  // requests being answered
};

// A connection as the exchange and the transport see it (the stream type is
// the connection's business).
class ConnectionBase : public std::enable_shared_from_this<ConnectionBase> {
 public:
  virtual ~ConnectionBase() = default;
  virtual void Post(std::function<void()> f) = 0;
  virtual void SendWhole(uint64_t seq, HttpResponse res) = 0;
  virtual void BeginStream(uint64_t seq, HttpResponse head) = 0;
  virtual void Write(uint64_t seq, std::string data) = 0;
  virtual void End(uint64_t seq) = 0;
  virtual void OnGone(uint64_t seq, std::function<void()> f) = 0;
  virtual void After(uint64_t seq, absl::Duration delay, std::function<void()> f) = 0;
  virtual void Hold(uint64_t seq, std::shared_ptr<void> token) = 0;
  virtual void Close() = 0;
};

class Exchange final : public HttpExchange {
 public:
  Exchange(std::shared_ptr<ConnectionBase> conn, uint64_t seq, HttpRequest request,
           std::shared_ptr<WorkPool> defer)
      : conn_(std::move(conn)), seq_(seq), request_(std::move(request)), defer_(std::move(defer)) {}
  const HttpRequest& request() const override { return request_; }
  void Send(HttpResponse response) override {
    conn_->Post([c = conn_, s = seq_, r = std::move(response)]() mutable {
      c->SendWhole(s, std::move(r));
    });
  }
  void BeginStream(HttpResponse head) override {
    conn_->Post(
        [c = conn_, s = seq_, h = std::move(head)]() mutable { c->BeginStream(s, std::move(h)); });
  }
  void Write(std::string data) override {
    conn_->Post(
        [c = conn_, s = seq_, d = std::move(data)]() mutable { c->Write(s, std::move(d)); });
  }
  void End() override {
    conn_->Post([c = conn_, s = seq_] { c->End(s); });
  }
  void OnClientGone(std::function<void()> f) override {
    conn_->Post([c = conn_, s = seq_, f = std::move(f)]() mutable { c->OnGone(s, std::move(f)); });
  }
  void After(absl::Duration delay, std::function<void()> f) override {
    conn_->Post([c = conn_, s = seq_, delay, f = std::move(f)]() mutable {
      c->After(s, delay, std::move(f));
    });
  }
  void Defer(std::function<void()> f) override { defer_->Submit(std::move(f)); }
  void Hold(std::shared_ptr<void> token) override {
    conn_->Post(
        [c = conn_, s = seq_, t = std::move(token)]() mutable { c->Hold(s, std::move(t)); });
  }

 private:
  std::shared_ptr<ConnectionBase> conn_;
  const uint64_t seq_;
  const HttpRequest request_;
  std::shared_ptr<WorkPool> defer_;
};

}  // namespace http_transport_detail

using http_transport_detail::ConnectionBase;
using http_transport_detail::Exchange;
using http_transport_detail::IoShared;
using http_transport_detail::Route;
using http_transport_detail::WorkPool;

// ---- the transport ----

class HttpTransport::Impl {
 public:
  explicit Impl(HttpTransportOptions o)
      : options(std::move(o)),
        shared(std::make_shared<IoShared>(std::max(1, options.io_threads))),
        acceptor(shared->io),
        accept_retry(shared->io) {}

  // The connection's view of the server: routes and hooks (read on I/O
  // threads after Start; set before).
  struct Lookup {
    const Route* route = nullptr;
    std::string allow;  // methods of routes matching the path, for a 405
    std::vector<std::string> matches;
  };
  Lookup Find(const std::string& method, const std::string& path) const {
    Lookup out;
    const std::string want = method == "HEAD" ? "GET" : method;
    for (const Route& r : routes) {
      std::smatch m;
      if (!std::regex_match(path, m, r.pattern)) continue;
      if (r.method == want && out.route == nullptr) {
        out.route = &r;
        for (const auto& g : m) out.matches.push_back(g.str());
      }
      if (!absl::StrContains(out.allow, r.method)) {
        absl::StrAppend(&out.allow, out.allow.empty() ? "" : ", ", r.method);
        if (r.method == "GET") out.allow += ", HEAD";
      }
    }
    return out;
  }
  HttpResponse Error(int status, const HttpRequest& req) const {
    HttpResponse res;
    res.status = status;
    if (error_handler) error_handler(req, res);
    if (res.body.empty()) {
      res.set_content(absl::StrCat("HTTP ", status, "\n"), "text/plain");
    }
    return res;
  }
  void Dispatch(const Route& route, std::shared_ptr<Exchange> exchange) {
    WorkPool& pool = route.method == "GET" ? *get_pool : *post_pool;
    pool.Submit([this, &route, exchange] {
      try {
        if (route.async) {
          route.async(exchange);
        } else {
          HttpResponse res;
          route.handler(exchange->request(), res);
          exchange->Send(std::move(res));
        }
      } catch (const std::exception& e) {
        spdlog::error("http: {} {}: {}", exchange->request().method, exchange->request().path,
                      e.what());
        HttpResponse res = Error(500, exchange->request());
        exchange->Send(std::move(res));
      }
    });
  }

  void Register(uint64_t id, std::weak_ptr<ConnectionBase> c) {
    std::lock_guard<std::mutex> l(conns_mu);
    conns[id] = std::move(c);
  }
  void Unregister(uint64_t id) {
    std::lock_guard<std::mutex> l(conns_mu);
    conns.erase(id);
  }

  void Accept();
  void OnAccept(const ErrorCode& ec, tcp::socket socket);
  void Refuse(tcp::socket socket);

  HttpTransportOptions options;
  std::shared_ptr<IoShared> shared;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  std::unique_ptr<asio::ssl::context> ssl;
  int max_connections = 0;
  int port = 0;
  std::vector<Route> routes;
  PreRoutingHandler pre_routing;
  ResponseDecorator decorate;
  ErrorHandler error_handler;
  Logger logger;
  // GET handlers, POST handlers, deferred work (shared: exchanges may outlive
  // the transport; a stopped pool drops what it is given).
  std::shared_ptr<WorkPool> get_pool = std::make_shared<WorkPool>();
  std::shared_ptr<WorkPool> post_pool = std::make_shared<WorkPool>();
  std::shared_ptr<WorkPool> defer_pool = std::make_shared<WorkPool>();
  std::vector<std::thread> threads;
  // Keeps the I/O threads running until Stop, whatever is pending.
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::mutex conns_mu;
  std::map<uint64_t, std::weak_ptr<ConnectionBase>> conns;
  std::atomic<uint64_t> next_id{1};
  std::atomic<bool> stopped{false};
  absl::Time last_accept_warning = absl::InfinitePast();
};

namespace {

using Impl = HttpTransport::Impl;

template <class Stream>
class Connection final : public ConnectionBase {
 public:
  Connection(Impl* server, std::shared_ptr<IoShared> shared, uint64_t id, Stream stream)
      : server_(server),
        shared_(std::move(shared)),
        id_(id),
        stream_(std::move(stream)),
        read_timer_(Socket().get_executor()),
        write_timer_(Socket().get_executor()) {
    ++shared_->open;
  }
  ~Connection() override { --shared_->open; }

  void Start() {
    ErrorCode ec;
    const tcp::endpoint peer = Socket().remote_endpoint(ec);
    if (!ec) {
      remote_addr_ = peer.address().to_string();
      remote_port_ = peer.port();
    }
    Socket().set_option(tcp::no_delay(true), ec);
    // The kernel's share of what waits for a slow client is bounded too: with
    // a stream bound under what send-buffer autotuning may reach, the socket
    // buffer is held to it.
    if (const auto& buffers = server_->options.client_buffers;
        buffers && buffers->options().max_stream_bytes < kAutotunedSendBuffer) {
      Socket().set_option(asio::socket_base::send_buffer_size(
                              static_cast<int>(buffers->options().max_stream_bytes)),
                          ec);
    }
    if constexpr (kTls) {
      phase_ = Phase::kHandshake;
      ArmRead(server_->options.connections.header_timeout);
      stream_.async_handshake(asio::ssl::stream_base::server, [self = Self()](const ErrorCode& e) {
        if (e) return self->Close();
        self->BeginRequest(/*first=*/true);
      });
    } else {
      BeginRequest(/*first=*/true);
    }
  }

  void Post(std::function<void()> f) override { asio::post(Socket().get_executor(), std::move(f)); }

  void SendWhole(uint64_t seq, HttpResponse res) override {
    if (!Current(seq) || started_) return;
    started_ = true;
    if (server_->decorate) server_->decorate(request_, res);
    response_.status = res.status;  // for the logger (the body goes out below)
    response_.headers = res.headers;
    response_.content_type = res.content_type;
    const bool head_only = request_method_ == "HEAD";
    close_after_ = close_after_ || !keep_alive_;
    Queue(ResponseHead(res, res.body.size(), false, close_after_, keep_alive_ && version_ == 10));
    if (!head_only) Queue(std::move(res.body));
    ended_ = true;
    Flush();
  }

  void BeginStream(uint64_t seq, HttpResponse head) override {
    if (!Current(seq) || started_) return;
    started_ = true;
    if (server_->decorate) server_->decorate(request_, head);
    response_ = head;
    // HTTP/1.0 has no chunked encoding: the body ends with the connection.
    chunked_ = version_ == 11;
    if (!chunked_) close_after_ = true;
    close_after_ = close_after_ || !keep_alive_;
    Queue(ResponseHead(head, std::nullopt, chunked_, close_after_, false));
    Flush();
  }

  void Write(uint64_t seq, std::string data) override {
    if (!Current(seq) || !started_ || ended_ || data.empty()) return;
    if (chunked_) {
      char size[24];
      std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
      Queue(size);
      Queue(std::move(data));
      Queue("\r\n");
    } else {
      Queue(std::move(data));
    }
    if (!account_ && pending_.size() > kMaxQueuedOutput) {
      spdlog::warn("http: {}:{} does not read its stream; closing it", remote_addr_, remote_port_);
      ErrorCode ignored;
      Socket().set_option(asio::socket_base::linger(true, 0), ignored);
      return Abort();
    }
    Flush();
  }

  void End(uint64_t seq) override {
    if (!Current(seq) || !started_ || ended_) return;
    if (chunked_) Queue("0\r\n\r\n");
    ended_ = true;
    Flush();
  }

  void OnGone(uint64_t seq, std::function<void()> f) override {
    if (seq != seq_) return;
    // A client that left before the handler asked (its Close already ended
    // the exchange, incomplete) is gone all the same: a generation started
    // just before must still be cancelled.
    if (gone_ || (closed_ && !complete_)) {
      gone_ = true;
      f();
      return;
    }
    if (complete_) return;
    on_gone_ = std::move(f);
  }

  void After(uint64_t seq, absl::Duration delay, std::function<void()> f) override {
    if (!Current(seq)) return;
    auto timer = std::make_shared<asio::steady_timer>(Socket().get_executor());
    timer->expires_after(absl::ToChronoNanoseconds(delay));
    timer->async_wait([self = Self(), timer, seq, f = std::move(f)](const ErrorCode& ec) {
      if (!ec && self->Current(seq)) f();
    });
  }

  void Hold(uint64_t seq, std::shared_ptr<void> token) override {
    if (Current(seq)) held_.push_back(std::move(token));
  }

  void Close() override {
    if (closed_) return;
    closed_ = true;
    phase_ = Phase::kClosed;
    ++read_gen_;
    ++write_gen_;
    read_timer_.cancel();
    write_timer_.cancel();
    ErrorCode ec;
    Socket().shutdown(tcp::socket::shutdown_both, ec);
    Socket().close(ec);
    if (exchange_live_ && !complete_) {
      FireGone();
      Finish(/*complete=*/false);
    }
    server_->Unregister(id_);
  }

 private:
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;
  enum class Phase { kHandshake, kHead, kBody, kHandling, kDiscard, kClosed };

  std::shared_ptr<Connection> Self() {
    return std::static_pointer_cast<Connection>(shared_from_this());
  }
  tcp::socket& Socket() { return beast::get_lowest_layer(stream_); }
  bool Current(uint64_t seq) const { return !closed_ && seq == seq_ && !complete_; }

  // ---- reading ----

  void BeginRequest(bool first) {
    phase_ = Phase::kHead;
    ++seq_;
    started_ = ended_ = chunked_ = complete_ = gone_ = exchange_live_ = false;
    close_after_ = false;
    on_gone_ = nullptr;
    response_ = HttpResponse();
    request_ = HttpRequest();
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(server_->options.max_body_bytes);
    // A new connection has header_timeout for its first request; a kept-alive
    // one may sit idle for idle_timeout, then has header_timeout from the
    // first byte of the next request.
    awaiting_first_byte_ = !first && buffer_.size() == 0;
    got_bytes_ = buffer_.size() > 0;
    ArmRead(awaiting_first_byte_ ? server_->options.connections.idle_timeout
                                 : server_->options.connections.header_timeout);
    Parse();
    Read();
  }

  void Read() {
    if (reading_ || closed_) return;
    if (phase_ == Phase::kHandling && buffer_.size() >= kPipelineLimit) return;  // resumes later
    reading_ = true;
    stream_.async_read_some(
        asio::buffer(read_chunk_),
        [self = Self()](const ErrorCode& ec, size_t n) { self->OnRead(ec, n); });
  }

  void OnRead(const ErrorCode& ec, size_t n) {
    reading_ = false;
    if (closed_) return;
    if (ec) {
      // The client closed (or reset) the connection: between requests that
      // is the normal end; while its request runs, it is gone. A client that
      // read the whole answer and closed before this side saw its last write
      // complete is not gone: that write's completion ends the exchange.
      if (ended_ && writing_ && !complete_) {
        peer_closed_ = true;
        return;
      }
      return Close();
    }
    if (phase_ == Phase::kDiscard) {
      buffer_.consume(buffer_.size());
      return Read();
    }
    buffer_.commit(asio::buffer_copy(buffer_.prepare(n), asio::buffer(read_chunk_.data(), n)));
    if (phase_ == Phase::kHead) got_bytes_ = true;
    if (awaiting_first_byte_ && phase_ == Phase::kHead) {
      awaiting_first_byte_ = false;
      ArmRead(server_->options.connections.header_timeout);
    }
    Parse();
    Read();
  }

  // Feeds the buffered bytes to the parser while a request is being read.
  void Parse() {
    while ((phase_ == Phase::kHead || phase_ == Phase::kBody) && !closed_) {
      if (buffer_.size() == 0 && !(phase_ == Phase::kBody && parser_->is_done())) return;
      ErrorCode ec;
      if (!parser_->is_done()) {
        const size_t used = parser_->put(buffer_.data(), ec);
        buffer_.consume(used);
        if (ec == http::error::need_more) return;
        if (ec) return OnBadRequest(ec);
      }
      if (phase_ == Phase::kHead && parser_->is_header_done()) {
        OnHead();
        continue;
      }
      if (phase_ == Phase::kBody && parser_->is_done()) return OnRequest();
    }
  }

  void OnBadRequest(const ErrorCode& ec) {
    const bool too_large = ec == http::error::body_limit;
    if (!too_large) {
      spdlog::debug("http: bad request from {}:{}: {}", remote_addr_, remote_port_, ec.message());
    }
    if (request_.method.empty()) request_.method = "?";
    if (ec == http::error::header_limit) return RespondEarly(server_->Error(431, request_));
    RespondEarly(server_->Error(too_large ? 413 : 400, request_));
  }

  void OnHead() {
    const auto& head = parser_->get();
    request_.method = std::string(head.method_string());
    request_.target = std::string(head.target());
    request_.path = request_.target.substr(0, request_.target.find('?'));
    request_.version = head.version() == 10 ? 10 : 11;
    for (const auto& field : head) {
      request_.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    request_.remote_addr = remote_addr_;
    request_.remote_port = remote_port_;
    request_.received = absl::Now();
    request_.access = std::make_shared<AccessRecord>(
        absl::StrCat(request_.method, " ", request_.path), request_.received);
    request_method_ = request_.method;
    version_ = request_.version;
    keep_alive_ = head.keep_alive();
    phase_ = Phase::kBody;
    ArmRead(server_->options.connections.body_timeout);

    HttpResponse early;
    if (server_->pre_routing && server_->pre_routing(request_, early))
      return RespondEarly(std::move(early));
    Impl::Lookup found = server_->Find(request_.method, request_.path);
    if (found.route == nullptr) {
      if (found.allow.empty()) return RespondEarly(server_->Error(404, request_));
      HttpResponse res = server_->Error(405, request_);
      res.set_header("Allow", found.allow);
      return RespondEarly(std::move(res));
    }
    if (parser_->content_length() && *parser_->content_length() > server_->options.max_body_bytes) {
      return RespondEarly(server_->Error(413, request_));
    }
    route_ = found.route;
    request_.matches = std::move(found.matches);
    if (absl::EqualsIgnoreCase(request_.get_header_value("Expect"), "100-continue") &&
        !parser_->is_done()) {
      Queue("HTTP/1.1 100 Continue\r\n\r\n");
      Flush();
    }
  }

  void OnRequest() {
    phase_ = Phase::kHandling;
    DisarmRead();
    request_.body = std::move(parser_->get().body());
    parser_.reset();
    SetLive();
    auto exchange =
        std::make_shared<Exchange>(shared_from_this(), seq_, request_, server_->defer_pool);
    server_->Dispatch(*route_, std::move(exchange));
  }

  // An answer before the body was read (refused, unknown path, bad request):
  // the connection closes after it unless there was no body to skip.
  void RespondEarly(HttpResponse res) {
    const bool body_unread = !parser_ || !parser_->is_done();
    DisarmRead();
    phase_ = Phase::kHandling;
    SetLive();
    if (body_unread) close_after_ = true;
    SendWhole(seq_, std::move(res));
  }

  // ---- deadlines ----

  void ArmRead(absl::Duration d) {
    const uint64_t gen = ++read_gen_;
    read_timer_.expires_after(absl::ToChronoNanoseconds(d));
    read_timer_.async_wait([self = Self(), gen](const ErrorCode& ec) {
      if (ec || gen != self->read_gen_ || self->closed_) return;
      self->OnReadDeadline();
    });
  }
  void DisarmRead() {
    ++read_gen_;
    read_timer_.cancel();
  }

  void OnReadDeadline() {
    switch (phase_) {
      case Phase::kHead:
        // Nothing sent (an idle connection): closed without a word.
        if (awaiting_first_byte_ || !got_bytes_ || parser_->is_header_done()) return Close();
        [[fallthrough]];
      case Phase::kBody:
        if (!started_) {
          if (request_.method.empty()) request_.method = "?";
          spdlog::debug("http: {}:{} too slow sending its request; 408", remote_addr_,
                        remote_port_);
          return RespondEarly(server_->Error(408, request_));
        }
        return Close();
      default:
        return Close();
    }
  }

  // ---- writing ----

  // Adds `data` to what goes out next, counted in the exchange's account.
  void Queue(std::string data) {
    if (server_->options.client_buffers && exchange_live_ && !complete_ && !closed_) {
      if (!account_) {
        stall_ = std::make_shared<StallHandle>(Self(), seq_);
        account_ = server_->options.client_buffers->Open(stall_);
      }
      account_->Add(data.size());
      counted_pending_ += data.size();
    }
    pending_ += data;
  }

  // The flow-control bounds' view of this connection's current exchange.
  struct StallHandle final : BufferedStream {
    StallHandle(std::shared_ptr<Connection> c, uint64_t s) : conn(c), seq(s) {}
    void EndStalled(const absl::Status& status) override { End(std::string(status.message())); }
    void Drop() override { End("the client took nothing more"); }
    void End(std::string why) {
      auto c = conn.lock();
      if (!c) return;
      c->Post([c, s = seq, why = std::move(why)] {
        if (!c->Current(s)) return;
        spdlog::warn("http: {}:{}: {}; closing the connection", c->remote_addr_, c->remote_port_,
                     why);
        // Reset, not closed in order: what the kernel still holds for the
        // client is dropped too.
        ErrorCode ignored;
        c->Socket().set_option(asio::socket_base::linger(true, 0), ignored);
        c->Abort();
      });
    }
    std::weak_ptr<Connection> conn;
    const uint64_t seq;
  };

  void Flush() {
    if (closed_ || writing_) return;
    if (pending_.empty()) {
      if (ended_ && !complete_) OnResponseWritten();
      return;
    }
    writing_ = true;
    writing_buffer_.swap(pending_);
    pending_.clear();
    counted_writing_ = counted_pending_;
    counted_pending_ = 0;
    const uint64_t gen = ++write_gen_;
    write_timer_.expires_after(
        absl::ToChronoNanoseconds(server_->options.connections.write_timeout));
    write_timer_.async_wait([self = Self(), gen](const ErrorCode& ec) {
      if (ec || gen != self->write_gen_ || self->closed_) return;
      spdlog::debug("http: a write to {}:{} stalled; closing", self->remote_addr_,
                    self->remote_port_);
      self->Abort();
    });
    asio::async_write(stream_, asio::buffer(writing_buffer_),
                      [self = Self()](const ErrorCode& ec, size_t) { self->OnWrite(ec); });
  }

  void OnWrite(const ErrorCode& ec) {
    writing_ = false;
    ++write_gen_;
    write_timer_.cancel();
    if (closed_) return;
    if (ec) return Abort();
    if (account_) account_->Remove(counted_writing_);
    counted_writing_ = 0;
    if (writing_buffer_.capacity() > kKeptBufferBytes) {
      std::string().swap(writing_buffer_);
    } else {
      writing_buffer_.clear();
    }
    Flush();
  }

  void OnResponseWritten() {
    Finish(/*complete=*/true);
    if (peer_closed_) return Close();
    if (close_after_) return Linger();
    BeginRequest(/*first=*/false);
  }

  // The logger sees each request once, complete or not.
  void SetLive() {
    if (!exchange_live_) ++shared_->busy;
    exchange_live_ = true;
  }
  void Finish(bool complete) {
    complete_ = true;
    if (exchange_live_) --shared_->busy;
    exchange_live_ = false;
    on_gone_ = nullptr;
    // What is still counted is dropped with the account (a closed connection).
    account_.reset();
    stall_.reset();
    counted_pending_ = counted_writing_ = 0;
    held_.clear();
    if (server_->logger && !request_.method.empty()) {
      if (!started_) response_.status = 499;  // the client left before any answer
      server_->logger(request_, response_, complete);
    }
  }

  void FireGone() {
    if (gone_) return;
    gone_ = true;
    if (on_gone_) {
      auto f = std::move(on_gone_);
      on_gone_ = nullptr;
      f();
    }
  }

  // The client went away (or cannot keep up): tell the handler, close.
  void Abort() {
    if (exchange_live_ && !complete_) FireGone();
    Close();
  }

  // After an early answer: stop sending, drop what the client still sends
  // for a while, then close.
  void Linger() {
    phase_ = Phase::kDiscard;
    ErrorCode ec;
    Socket().shutdown(tcp::socket::shutdown_send, ec);
    buffer_.consume(buffer_.size());
    ArmRead(kLinger);
    Read();
  }

  Impl* server_;
  std::shared_ptr<IoShared> shared_;
  const uint64_t id_;
  Stream stream_;
  asio::steady_timer read_timer_, write_timer_;
  uint64_t read_gen_ = 0, write_gen_ = 0;
  // What was read and not yet parsed. A read is under way for most of a
  // connection's life (while a request is answered too), so it reads into
  // read_chunk_, never into buffer_: taking a waiting request out of buffer_
  // (consume) moves where buffer_'s next bytes go, and bytes read into a region
  // prepared before that would be committed as stale ones (the request before,
  // or part of it: answered twice, or an unfinished head and 408).
  beast::flat_buffer buffer_;
  std::array<char, kReadChunk> read_chunk_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::kHead;
  bool reading_ = false, writing_ = false, closed_ = false;
  bool awaiting_first_byte_ = false;
  bool got_bytes_ = false;  // of the request being read
  std::string remote_addr_;
  int remote_port_ = 0;
  // The request being answered.
  uint64_t seq_ = 0;
  HttpRequest request_;
  std::string request_method_;
  int version_ = 11;
  bool keep_alive_ = true;
  const Route* route_ = nullptr;
  HttpResponse response_;  // status and headers, for the logger
  bool exchange_live_ = false, started_ = false, ended_ = false, chunked_ = false;
  bool complete_ = false, close_after_ = false, gone_ = false, peer_closed_ = false;
  std::function<void()> on_gone_;
  std::string pending_, writing_buffer_;
  // Flow control of the current exchange: its account (bytes of pending_ and
  // writing_buffer_ counted in it) and the tokens it holds.
  std::unique_ptr<StreamAccount> account_;
  std::shared_ptr<StallHandle> stall_;
  size_t counted_pending_ = 0, counted_writing_ = 0;
  std::vector<std::shared_ptr<void>> held_;
};

// Answers 503 to a connection over the limit, then closes it.
template <class Stream>
void RefuseOn(std::shared_ptr<IoShared> shared, std::shared_ptr<Stream> stream,
              std::string answer) {
  auto timer =
      std::make_shared<asio::steady_timer>(beast::get_lowest_layer(*stream).get_executor());
  timer->expires_after(std::chrono::seconds(2));
  timer->async_wait([stream](const ErrorCode& ec) {
    if (ec) return;
    ErrorCode ignored;
    beast::get_lowest_layer(*stream).close(ignored);
  });
  auto text = std::make_shared<std::string>(std::move(answer));
  auto write = [shared, stream, timer, text] {
    asio::async_write(
        *stream, asio::buffer(*text), [shared, stream, timer, text](const ErrorCode&, size_t) {
          ErrorCode ignored;
          beast::get_lowest_layer(*stream).shutdown(tcp::socket::shutdown_both, ignored);
          beast::get_lowest_layer(*stream).close(ignored);
          timer->cancel();
          --shared->refusing;
        });
  };
  if constexpr (std::is_same_v<Stream, tcp::socket>) {
    write();
  } else {
    stream->async_handshake(asio::ssl::stream_base::server,
                            [shared, stream, timer, write](const ErrorCode& ec) {
                              if (ec) {
                                timer->cancel();
                                --shared->refusing;
                                return;
                              }
                              write();
                            });
  }
}

}  // namespace

void HttpTransport::Impl::Accept() {
  acceptor.async_accept(
      asio::make_strand(shared->io),
      [this](const ErrorCode& ec, tcp::socket socket) { OnAccept(ec, std::move(socket)); });
}

void HttpTransport::Impl::OnAccept(const ErrorCode& ec, tcp::socket socket) {
  if (stopped) return;
  if (ec) {
    if (ec == asio::error::operation_aborted) return;
    // Out of descriptors (EMFILE) or the like: say so now and then, and try
    // again shortly rather than spinning.
    if (absl::Now() - last_accept_warning > absl::Seconds(10)) {
      last_accept_warning = absl::Now();
      spdlog::warn("http: accept on {} failed: {}", options.listen, ec.message());
    }
    accept_retry.expires_after(std::chrono::milliseconds(50));
    accept_retry.async_wait([this](const ErrorCode& e) {
      if (!e && !stopped) Accept();
    });
    return;
  }
  if (shared->open.load() >= max_connections) {
    Refuse(std::move(socket));
  } else {
    const uint64_t id = next_id++;
    std::shared_ptr<ConnectionBase> conn;
    if (ssl) {
      auto c = std::make_shared<Connection<asio::ssl::stream<tcp::socket>>>(
          this, shared, id, asio::ssl::stream<tcp::socket>(std::move(socket), *ssl));
      conn = c;
      Register(id, conn);
      c->Post([c] { c->Start(); });  // on the connection's strand, like all it does
    } else {
      auto c = std::make_shared<Connection<tcp::socket>>(this, shared, id, std::move(socket));
      conn = c;
      Register(id, conn);
      c->Post([c] { c->Start(); });
    }
  }
  Accept();
}

void HttpTransport::Impl::Refuse(tcp::socket socket) {
  if (shared->refusing.load() >= kMaxRefusing) {
    ErrorCode ignored;
    socket.close(ignored);
    return;
  }
  ++shared->refusing;
  HttpRequest none;
  HttpResponse res = Error(503, none);
  res.set_header("Retry-After", "1");
  std::string answer = ResponseHead(res, res.body.size(), false, true, false) + res.body;
  if (absl::Now() - last_accept_warning > absl::Seconds(10)) {
    last_accept_warning = absl::Now();
    spdlog::warn("http: {} connections open (--http-max-connections); refusing new ones",
                 max_connections);
  }
  if (ssl) {
    RefuseOn(shared, std::make_shared<asio::ssl::stream<tcp::socket>>(std::move(socket), *ssl),
             std::move(answer));
  } else {
    RefuseOn(shared, std::make_shared<tcp::socket>(std::move(socket)), std::move(answer));
  }
}

namespace {

// Lets this process hold as many descriptors as it may (the soft limit up to
// the hard one); returns the soft limit.
rlim_t RaiseDescriptorLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 1024;
  if (r.rlim_cur < r.rlim_max) {
    rlimit want = r;
    want.rlim_cur = std::min<rlim_t>(r.rlim_max, 1 << 20);
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) r = want;
  }
  return r.rlim_cur;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpTransport>> HttpTransport::Create(HttpTransportOptions options) {
  absl::StatusOr<ListenAddress> address = ParseListenAddress(options.listen, options.flag);
  if (!address.ok()) return address.status();
  auto impl = std::make_unique<Impl>(std::move(options));
  Impl& s = *impl;
  if (s.options.tls.enabled()) {
    // AEAD suites only, TLS 1.2 and up, and with client_ca mTLS: as gRPC's port.
    s.ssl = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
    if (absl::Status st = ConfigureServerContext(s.options.tls, s.ssl->native_handle()); !st.ok()) {
      return st;
    }
  }
  // Descriptors: a connection is one; keep some for everything else.
  const rlim_t fds = RaiseDescriptorLimit();
  const int allowed = static_cast<int>(std::max<rlim_t>(16, fds > 512 ? fds - 256 : fds / 2));
  s.max_connections = std::max(1, std::min(s.options.connections.max_connections, allowed));
  if (s.max_connections < s.options.connections.max_connections) {
    spdlog::warn("http: {}: at most {} connections (the descriptor limit is {}), not {}",
                 s.options.flag, s.max_connections, static_cast<uint64_t>(fds),
                 s.options.connections.max_connections);
  }
  ErrorCode ec;
  tcp::resolver resolver(s.shared->io);
  const auto resolved =
      resolver.resolve(address->host, std::to_string(address->port), tcp::resolver::passive, ec);
  if (ec || resolved.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(s.options.flag, " '", s.options.listen,
                                                   "': cannot resolve '", address->host, "'"));
  }
  const tcp::endpoint endpoint = resolved.begin()->endpoint();
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) SetListenSocketOptions(s.acceptor.native_handle());
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(s.options.flag, " ", s.options.listen,
                                               ": cannot listen on it: ", ec.message()));
  }
  s.port = s.acceptor.local_endpoint().port();
  return std::unique_ptr<HttpTransport>(new HttpTransport(std::move(impl)));
}

HttpTransport::HttpTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpTransport::~HttpTransport() { Stop(); }

void HttpTransport::Get(const std::string& pattern, Handler handler) {
  impl_->routes.push_back(Route{"GET", std::regex(pattern), std::move(handler), nullptr});
}
void HttpTransport::Post(const std::string& pattern, Handler handler) {
  impl_->routes.push_back(Route{"POST", std::regex(pattern), std::move(handler), nullptr});
}
void HttpTransport::Post(const std::string& pattern, AsyncHandler handler) {
  impl_->routes.push_back(Route{"POST", std::regex(pattern), nullptr, std::move(handler)});
}

void HttpTransport::Delete(const std::string& pattern, Handler handler) {
  impl_->routes.push_back(Route{"DELETE", std::regex(pattern), std::move(handler), nullptr});
}
void HttpTransport::set_response_decorator(ResponseDecorator decorator) {
  impl_->decorate = std::move(decorator);
}

void HttpTransport::set_pre_routing_handler(PreRoutingHandler handler) {
  impl_->pre_routing = std::move(handler);
}
void HttpTransport::set_error_handler(ErrorHandler handler) {
  impl_->error_handler = std::move(handler);
}
void HttpTransport::set_logger(Logger logger) { impl_->logger = std::move(logger); }

void HttpTransport::Start() {
  Impl& s = *impl_;
  s.get_pool->Start(std::max(1, s.options.get_threads));
  s.post_pool->Start(std::max(1, s.options.post_threads));
  s.defer_pool->Start(std::max(1, s.options.defer_threads));
  s.work.emplace(s.shared->io.get_executor());
  asio::post(s.acceptor.get_executor(), [&s] { s.Accept(); });
  for (int i = 0; i < std::max(1, s.options.io_threads); ++i) {
    s.threads.emplace_back([&s] { s.shared->io.run(); });
  }
}

int HttpTransport::port() const { return impl_->port; }
int HttpTransport::connections() const { return impl_->shared->open.load(); }

void HttpTransport::Stop(absl::Duration grace) {
  Impl& s = *impl_;
  if (s.stopped.exchange(true)) return;
  asio::post(s.acceptor.get_executor(), [&s] {
    ErrorCode ignored;
    s.acceptor.close(ignored);
    s.accept_retry.cancel();
  });
  const absl::Time deadline = absl::Now() + grace;
  while (!s.threads.empty() && s.shared->busy.load() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::vector<std::shared_ptr<ConnectionBase>> open;
  {
    std::lock_guard<std::mutex> l(s.conns_mu);
    for (auto& [id, weak] : s.conns) {
      if (auto c = weak.lock()) open.push_back(std::move(c));
    }
  }
  for (auto& c : open) c->Post([c] { c->Close(); });
  open.clear();
  s.get_pool->Stop();
  s.post_pool->Stop();
  s.defer_pool->Stop();
  // Let the closes run, then stop the loop.
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> closed = done->get_future();
  asio::post(s.acceptor.get_executor(), [done] { done->set_value(); });
  if (!s.threads.empty()) closed.wait_for(std::chrono::seconds(2));
  s.work.reset();
  s.shared->io.stop();
  for (std::thread& t : s.threads) {
    if (t.joinable()) t.join();
  }
  s.threads.clear();
}

}  // namespace flotilla::coordinator
