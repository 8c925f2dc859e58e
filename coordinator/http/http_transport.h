// The HTTP/1.1 transport under the coordinator's OpenAI-compatible API: an
// event-driven server (Boost.Beast's parser on Boost.Asio sockets, OpenSSL for
// HTTPS) that no client can starve.
//
// - Connections cost a socket, never a thread: a few I/O threads serve them
//   all. Handlers run on two small pools: GET routes (health, metrics,
//   models) on one, POST routes (generation) on another, so /health answers
//   whatever the generation load. A generation's handler returns once it has
//   submitted; its stream (or whole answer) is written from callbacks.
// - Deadlines per connection: the request head within `header_timeout` of
//   its first byte (of the connection's start for the first request; 408
//   past it), the body within `body_timeout` of the head, a kept-alive
//   connection closed after `idle_timeout` without a request, a write (of
//   what is queued) that does not complete within `write_timeout` ends the
//   connection.
// - A response's unwritten bytes are bounded (options.client_buffers): a
//   client that does not read has its connection closed (client_buffers.h).
// - At most `max_connections` open connections; past that a new one gets
//   503 ("too many connections") and is closed.
// - One request at a time per connection, in order: pipelined requests wait
//   in the buffer and are answered in turn. HTTP/1.0 clients get no chunked
//   encoding (a stream ends with the connection) and keep-alive only when
//   they ask for it. A known path with another method is 405 with Allow.
// - A request refused before its body is read (the pre-routing handler,
//   413, 404, 405) gets its answer and then the connection closes; what the
//   client still sends is read and dropped for a few seconds first, so it
//   sees the answer rather than a reset.
// - A client that closes its connection while its request runs is noticed at
//   once (the connection is read throughout), and OnClientGone fires.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls_credentials.h"
#include "coordinator/access_log.h"
#include "coordinator/client_buffers.h"

namespace flotilla::coordinator {

// How many connections a listener holds and how long each may take to send
// or read: set on the HTTP server (HttpServerOptions) and handed to its
// transport as they are.
struct HttpConnectionLimits {
  // Connections past this get 503 and are closed (clamped to what the
  // descriptor limit allows).
  int max_connections = 4096;
  // A request's head must arrive within header_timeout of its first byte
  // (408), its body within body_timeout of the head; a kept-alive connection
  // closes after idle_timeout without a request, and one whose response
  // write stalls (the client reads nothing) for write_timeout.
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(60);
  absl::Duration idle_timeout = absl::Seconds(60);
  absl::Duration write_timeout = absl::Seconds(60);
};

struct HttpTransportOptions {
  std::string listen;                  // HOST:PORT; port 0 = any free port
  std::string flag = "--http-listen";  // named in errors
  TlsServerFiles tls;                  // cert and key: HTTPS only; client_ca: mTLS
  size_t max_body_bytes = 16 << 20;    // larger bodies: 413, unread
  HttpConnectionLimits connections;
  int io_threads = 2;
  int get_threads = 2;    // GET handlers (health, metrics, models)
  int post_threads = 4;   // POST handlers (preparing and submitting generations)
  int defer_threads = 2;  // HttpExchange::Defer (turning tokens into response bytes)
  // Flow control: each response's unwritten bytes are counted in it, and a
  // response whose client does not read is ended by its bounds (the
  // connection closes, OnClientGone fires). Null: a response may queue 64 MiB.
  std::shared_ptr<ClientBuffers> client_buffers;
};

// One request, as handlers see it (the subset of cpp-httplib's Request the
// API uses, so handlers read the same).
struct HttpRequest {
  std::string method;
  std::string target;  // as sent
  std::string path;    // target without the query
  int version = 11;    // 10 or 11
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string remote_addr;
  int remote_port = 0;
  std::vector<std::string> matches;  // the route's regex groups, [0] = the whole path
  absl::Time received;               // when the head was complete
  // What the access log says about this request; handlers add to it.
  std::shared_ptr<AccessRecord> access;

  bool has_header(std::string_view name) const;
  // The first value of header `name` (case-insensitive); empty when absent.
  std::string get_header_value(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string content_type;
  std::string body;

  void set_header(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
  }
  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
};

// The answer to one request, for handlers that answer later (from other
// threads). Exactly one of Send or BeginStream, once; every call is safe from
// any thread and does nothing once the connection is gone.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual const HttpRequest& request() const = 0;
  // A whole response (with Content-Length).
  virtual void Send(HttpResponse response) = 0;
  // Starts a streamed body with `head`'s status, headers and content type
  // (chunked to HTTP/1.1 clients; to HTTP/1.0 ones the body ends with the
  // connection); Write adds to it, End completes it.
  virtual void BeginStream(HttpResponse head) = 0;
  virtual void Write(std::string data) = 0;
  virtual void End() = 0;
  // `f` runs once, on an I/O thread, if the client goes away (its connection
  // closes, a write fails or stalls) before the response is complete; at once
  // when it already has. Not after a complete response.
  virtual void OnClientGone(std::function<void()> f) = 0;
  // Runs `f` on an I/O thread after `delay`, unless the connection is gone.
  virtual void After(absl::Duration delay, std::function<void()> f) = 0;
  // Runs `f` soon on one of the transport's worker threads: for work a
  // caller's thread (e.g. the gRPC thread that delivers tokens) must not do.
  virtual void Defer(std::function<void()> f) = 0;
  // Keeps `token` until the response is completely written or the connection
  // ends (e.g. ClientBuffers' count of open requests).
  virtual void Hold(std::shared_ptr<void> token) = 0;
};

class HttpTransport {
 public:
  // Handlers that answer before they return (on a pool thread).
  using Handler = std::function<void(const HttpRequest&, HttpResponse&)>;
  // Handlers that answer through the exchange, now or later.
  using AsyncHandler = std::function<void(std::shared_ptr<HttpExchange>)>;
  // Sees each request when its head is in, before the body is read (on an I/O
  // thread: keep it cheap). Returns true when it answered in `res`.
  using PreRoutingHandler = std::function<bool(const HttpRequest&, HttpResponse&)>;
  // Fills the body of an error the transport produced (404, 405, 408, 413,
  // 400, 503 for too many connections; `req.method` is empty for the last).
  using ErrorHandler = std::function<void(const HttpRequest&, HttpResponse&)>;
  // Sees each response of a routed request (whole or streamed, early ones
  // included) just before its head is written, to add headers (CORS).
  using ResponseDecorator = std::function<void(const HttpRequest&, HttpResponse&)>;
  // After each response is completely written, or its connection ended.
  using Logger = std::function<void(const HttpRequest&, const HttpResponse&, bool complete)>;

  static absl::StatusOr<std::unique_ptr<HttpTransport>> Create(HttpTransportOptions options);
  ~HttpTransport();

  // Routes (before Start): `pattern` is a regex over the whole path. GET
  // handlers run on the GET pool (HEAD is GET without the body), POST
  // handlers on the POST pool.
  void Get(const std::string& pattern, Handler handler);
  void Post(const std::string& pattern, Handler handler);
  void Post(const std::string& pattern, AsyncHandler handler);
  // DELETE handlers run on the POST pool.
  void Delete(const std::string& pattern, Handler handler);
  void set_pre_routing_handler(PreRoutingHandler handler);
  void set_error_handler(ErrorHandler handler);
  void set_response_decorator(ResponseDecorator decorator);
  void set_logger(Logger logger);

  // Starts accepting on the bound port.
  void Start();
  // The bound port.
  int port() const;
  // Open connections now (for tests and metrics).
  int connections() const;
  // Stops accepting; gives the responses under way up to `grace` to be
  // written; then closes every connection and waits for the threads.
  void Stop(absl::Duration grace = absl::ZeroDuration());

  class Impl;

 private:
  explicit HttpTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace flotilla::coordinator
