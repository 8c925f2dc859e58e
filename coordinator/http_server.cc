#include "coordinator/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grammar/constraint_proto.h"
#include "common/listen_address.h"
#include "coordinator/expert_metrics.h"
#include "coordinator/openai_pipeline.h"
#include "coordinator/request_registry.h"
#include "coordinator/served_models.h"
#include "coordinator/tokenize_api.h"
#include "spdlog/spdlog.h"

namespace flotilla::coordinator {

// ---- metrics ----

namespace {

void Gauge(std::string& out, const std::string& name, const std::string& help, double v) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n", name, " ", v, "\n");
}
void Counter(std::string& out, const std::string& name, const std::string& help, uint64_t v) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " counter\n", name, " ", v, "\n");
}

std::string LabelValue(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

class HttpMetrics {
 public:
  HttpMetrics() = default;

  void CountRequest(const std::string& path, int status) {
    std::lock_guard<std::mutex> l(mu_);
    ++requests_[{path, status}];
  }
  std::atomic<int64_t> in_flight{0};

  std::string Render(const admin::ClusterStatus& s, const ServingMetrics& serving) const {
    std::string out;
    out += "# HELP flotilla_http_requests_total HTTP requests answered, by path and status\n"
           "# TYPE flotilla_http_requests_total counter\n";
    {
      std::lock_guard<std::mutex> l(mu_);
      for (const auto& [key, n] : requests_) {
        absl::StrAppend(&out, "flotilla_http_requests_total{path=\"", LabelValue(key.first),
                        "\",status=\"", key.second, "\"} ", n, "\n");
      }
    }
    serving.Render(out);
    Gauge(out, "flotilla_http_requests_in_flight", "generation requests being served over HTTP",
          static_cast<double>(in_flight.load()));
    Counter(out, "flotilla_requests_submitted_total", "requests admitted (gRPC and HTTP)",
            s.requests_submitted());
    Counter(out, "flotilla_requests_cancelled_total",
            "requests ended early by a cancel, a client disconnect or a stop string",
            s.requests_cancelled());
    Gauge(out, "flotilla_requests_in_flight", "requests the coordinator is serving (gRPC and HTTP)",
          static_cast<double>(s.requests_in_flight()));
    Gauge(out, "flotilla_instance_ready", "1 while the instance takes requests",
          s.state() == admin::READY ? 1 : 0);
    uint64_t running = 0, queued = 0, kv_free = 0, kv_total = 0;
    uint64_t prefix_queries = 0, prefix_hits = 0;
    std::string per_worker;
    for (const admin::WorkerStatus& w : s.workers()) {
      running += w.load().running_sequences();
      queued += w.load().queued_sequences();
      kv_free += w.load().kv_blocks_free();
      kv_total += w.load().kv_blocks_total();
      prefix_queries += w.load().prefix_cache_queries_tokens();
      prefix_hits += w.load().prefix_cache_hits_tokens();
      const double usage = w.load().kv_blocks_total() == 0
                               ? 0.0
                               : 1.0 - static_cast<double>(w.load().kv_blocks_free()) /
                                           static_cast<double>(w.load().kv_blocks_total());
      absl::StrAppend(&per_worker, "flotilla_worker_kv_cache_usage_ratio{worker=\"",
                      LabelValue(w.worker_id()), "\",rank=\"", w.rank(), "\"} ", usage, "\n");
    }
    Gauge(out, "flotilla_running_sequences", "sequences running on the workers", static_cast<double>(running));
    Gauge(out, "flotilla_queued_sequences", "sequences waiting on the workers (queue depth)",
          static_cast<double>(queued));
    Gauge(out, "flotilla_kv_blocks_free", "free KV cache blocks over all workers", static_cast<double>(kv_free));
    Gauge(out, "flotilla_kv_blocks_total", "KV cache blocks over all workers", static_cast<double>(kv_total));
    Gauge(out, "flotilla_kv_cache_usage_ratio", "used fraction of the KV cache over all workers",
          kv_total == 0 ? 0.0 : 1.0 - static_cast<double>(kv_free) / static_cast<double>(kv_total));
    // Sums of the workers' counters since each started (a restarted worker
    // starts again from zero: Prometheus treats that as a counter reset).
    Counter(out, "flotilla_prefix_cache_queries_tokens_total",
            "prompt tokens looked up in the workers' prefix caches", prefix_queries);
    Counter(out, "flotilla_prefix_cache_hits_tokens_total",
            "prompt tokens found in the workers' prefix caches (not computed)", prefix_hits);
    out += "# HELP flotilla_worker_kv_cache_usage_ratio used fraction of one worker's KV cache\n"
           "# TYPE flotilla_worker_kv_cache_usage_ratio gauge\n";
    out += per_worker;
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
};

namespace {

// One request's updates, handed from the manager's callbacks to the HTTP thread.
struct Exchange {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<cluster::SequenceUpdate> updates;
  bool done = false;
  absl::Status status;
};

RequestCallbacks MakeCallbacks(const std::shared_ptr<Exchange>& ex) {
  RequestCallbacks cb;
  cb.on_update = [ex](const cluster::SequenceUpdate& u) {
    std::lock_guard<std::mutex> l(ex->mu);
    ex->updates.push_back(u);
    ex->cv.notify_all();
  };
  cb.on_done = [ex](const absl::Status& st) {
    std::lock_guard<std::mutex> l(ex->mu);
    ex->done = true;
    ex->status = st;
    ex->cv.notify_all();
  };
  return cb;
}

void SendJson(httplib::Response& res, int status, const Json& j) {
  res.status = status;
  res.set_content(DumpJson(j), "application/json");
}

void SendError(httplib::Response& res, const ApiError& e) { SendJson(res, e.http_status, ErrorJson(e)); }
void SendError(httplib::Response& res, const absl::Status& st) { SendError(res, ErrorFromStatus(st)); }

// Progress of one generation, driven by the HTTP thread.
struct Generation {
  std::shared_ptr<Exchange> ex;
  std::unique_ptr<ResponseBuilder> builder;
  uint64_t request_id = 0;
  uint32_t prompt_tokens = 0;
  uint32_t tokens_seen = 0;  // generated tokens delivered so far
  bool cancelled_for_stop = false;
  bool finished = false;     // Finish() called on the builder
  bool begun = false;
  bool ended = false;        // the whole response was produced
  bool include_usage = false;
};

// Feeds the queued updates; returns the chunks they produced. Sets `g.finished`
// when the last update arrived.
std::vector<Json> Drain(Generation& g, std::deque<cluster::SequenceUpdate>& updates, ClusterManager* manager) {
  std::vector<Json> out;
  for (const cluster::SequenceUpdate& u : updates) {
    if (g.finished || u.finish_reason() == common::ERROR) continue;
    std::vector<Json> c = g.builder->FeedUpdate(u);
    out.insert(out.end(), std::make_move_iterator(c.begin()), std::make_move_iterator(c.end()));
    g.tokens_seen += static_cast<uint32_t>(u.token_ids_size());
    if (g.builder->stopped_by_string()) {
      if (!g.cancelled_for_stop) {
        g.cancelled_for_stop = true;
        manager->Cancel(g.request_id, "a stop string was generated");
      }
      c = g.builder->Finish(common::STOP, std::nullopt, g.prompt_tokens, g.tokens_seen);
      out.insert(out.end(), std::make_move_iterator(c.begin()), std::make_move_iterator(c.end()));
      g.finished = true;
    } else if (u.finish_reason() != common::FINISH_REASON_UNSPECIFIED) {
      std::optional<tokenizer::TokenId> stop;
      if (u.has_stop_token()) stop = static_cast<tokenizer::TokenId>(u.stop_token());
      c = g.builder->Finish(u.finish_reason(), stop, u.prompt_tokens() ? u.prompt_tokens() : g.prompt_tokens,
                            u.completion_tokens());
      out.insert(out.end(), std::make_move_iterator(c.begin()), std::make_move_iterator(c.end()));
      g.finished = true;
    }
  }
  updates.clear();
  return out;
}

// The status that ended the generation, or OK when it ended normally (a
// cancel we sent for a stop string is normal).
absl::Status EndStatus(const Generation& g, const absl::Status& done_status) {
  if (g.finished) return absl::OkStatus();
  if (!done_status.ok()) return done_status;
  return absl::InternalError("the request ended without a finish reason");
}

// "ADDR" and port of a socket address (IPv4 or IPv6).
bool AddrPort(const sockaddr_storage& a, std::string* addr, int* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    *port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &in->sin6_addr, buf, sizeof(buf));
    *port = ntohs(in->sin6_port);
  } else {
    return false;
  }
  *addr = buf;
  return true;
}

// The connection a request arrived on (cpp-httplib does not hand it to
// handlers): the socket of this process whose two ends match the request's.
// -1 when not found. The socket stays open while the handler runs.
int ConnectionOf(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
        getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) {
      continue;
    }
    std::string la, pa;
    int lp = 0, pp = 0;
    if (!AddrPort(local, &la, &lp) || !AddrPort(peer, &pa, &pp)) continue;
    if (lp == req.local_port && pp == req.remote_port && pa == req.remote_addr &&
        (req.local_addr.empty() || la == req.local_addr)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

// Whether the peer closed (or reset) the connection. A request the client
// pipelined behind this one would be readable data, not a close.
bool PeerGone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP)) return true;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// The request's deadline from X-Request-Timeout or X-Stainless-Timeout
// (seconds, > 0); nullopt when neither is set.
absl::StatusOr<std::optional<absl::Time>> RequestDeadline(const httplib::Request& req,
                                                          absl::Time now) {
  for (const char* header : {"X-Request-Timeout", "X-Stainless-Timeout"}) {
    if (!req.has_header(header)) continue;
    const std::string v = req.get_header_value(header);
    char* end = nullptr;
    const double seconds = std::strtod(v.c_str(), &end);
    if (v.empty() || end == v.c_str() || *end != '\0' || !(seconds > 0) || seconds > 1e7) {
      return absl::InvalidArgumentError(
          absl::StrCat(header, " header: '", v, "' is not a positive number of seconds"));
    }
    return std::optional<absl::Time>(now + absl::Seconds(seconds));
  }
  return std::optional<absl::Time>();
}

}  // namespace

// ---- server ----

HttpServer::HttpServer(HttpServerOptions options, ClusterManager* manager,
                       const tokenizer::Tokenizer* tokenizer)
    : options_(std::move(options)),
      manager_(manager),
      tok_(tokenizer),
      metrics_(std::make_unique<HttpMetrics>()) {
  if (options_.served_model_names.empty()) options_.served_model_names = {options_.model_id};
  if (options_.tls.enabled()) {
    server_ =
        std::make_unique<httplib::SSLServer>(options_.tls.cert.c_str(), options_.tls.key.c_str());
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
  if (metrics_server_) metrics_server_->stop();
  if (metrics_thread_.joinable()) metrics_thread_.join();
}

namespace {

// Binds `server` to `listen` (HOST:PORT, port 0 = any); the bound port.
absl::StatusOr<int> Bind(httplib::Server& server, const std::string& listen, const char* flag) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      std::sscanf(listen.c_str() + colon + 1, "%d", &port) != 1 || port < 0 || port > 65535 ||
      std::to_string(port) != listen.substr(colon + 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", listen, "' is not HOST:PORT (port 0-65535)"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (port == 0) {
    port = server.bind_to_any_port(host);
    if (port <= 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  } else if (!server.bind_to_port(host, port)) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  return port;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(HttpServerOptions options,
                                                               ClusterManager* manager,
                                                               const tokenizer::Tokenizer* tokenizer) {
  if (options.tls.enabled()) {
    TlsServerFiles files = options.tls;
    files.client_ca.clear();
    if (absl::Status st = CheckServerFiles(files); !st.ok()) return st;
  }
  std::unique_ptr<HttpServer> s(new HttpServer(std::move(options), manager, tokenizer));
  if (!s->server_->is_valid()) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-cert ", s->options_.tls.cert,
                                                   ": cannot serve HTTPS with it and --tls-key"));
  }
  // cpp-httplib's default options add SO_REUSEPORT, which lets a second
  // server share a taken port; only SO_REUSEADDR here.
  s->server_->set_socket_options([](socket_t fd) { SetListenSocketOptions(fd); });
  s->Routes();
  // Streams hold a thread each while they last.
  s->server_->new_task_queue = [] { return new httplib::ThreadPool(64); };
  absl::StatusOr<int> port = Bind(*s->server_, s->options_.listen, "--http-listen");
  if (!port.ok()) return port.status();
  s->port_ = *port;
  httplib::Server* raw = s->server_.get();
  s->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  if (!s->options_.metrics_listen.empty()) {
    absl::Status metrics = s->ServeMetrics();
    if (!metrics.ok()) return metrics;  // the destructor stops the API listener
  }
  return s;
}

absl::Status HttpServer::ServeMetrics() {
  metrics_server_ = std::make_unique<httplib::Server>();
  metrics_server_->set_socket_options([](socket_t fd) { SetListenSocketOptions(fd); });
  metrics_server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_->Render(manager_->Status(), manager_->metrics()) +
                        RenderExpertMetrics(*manager_),
                    "text/plain; version=0.0.4");
  });
  absl::StatusOr<int> port = Bind(*metrics_server_, options_.metrics_listen, "--metrics-listen");
  if (!port.ok()) return port.status();
  metrics_port_ = *port;
  httplib::Server* raw = metrics_server_.get();
  metrics_thread_ = std::thread([raw] { raw->listen_after_bind(); });
  return absl::OkStatus();
}

bool HttpServer::Authorized(const httplib::Request& req, httplib::Response& res) const {
  if (options_.auth == nullptr || req.path == "/health") return true;
  absl::StatusOr<Caller> caller =
      options_.auth->Authenticate(req.get_header_value("Authorization"));
  if (caller.ok()) return true;
  // What OpenAI answers for a missing or wrong key.
  ApiError e;
  e.http_status = 401;
  e.type = "invalid_request_error";
  e.code = "invalid_api_key";
  e.message = std::string(caller.status().message());
  res.set_header("WWW-Authenticate", "Bearer");
  SendError(res, e);
  return false;
}

void HttpServer::Routes() {
  httplib::Server& svr = *server_;
  svr.set_payload_max_length(options_.limits.max_request_bytes == 0
                                 ? std::numeric_limits<size_t>::max()
                                 : options_.limits.max_request_bytes);
  svr.set_read_timeout(60, 0);
  svr.set_write_timeout(60, 0);
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return Authorized(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                : httplib::Server::HandlerResponse::Handled;
  });

  svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    static const char* kKnown[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                                   "/metrics", "/tokenize", "/detokenize"};
    std::string path = "other";
    for (const char* k : kKnown) {
      if (req.path == k) path = k;
    }
    if (req.path.rfind("/v1/models/", 0) == 0) path = "/v1/models/{id}";
    metrics_->CountRequest(path, res.status);
  });
  svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                    httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.http_status = res.status;
    e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
    if (res.status == 404) {
      e.message = absl::StrCat("unknown path: ", req.method, " ", req.path);
      e.code = "unknown_url";
    } else if (res.status == 413) {
      e.message = absl::StrCat("the request body is too large (this server's limit is ",
                               options_.limits.max_request_bytes, " bytes: --max-request-bytes)");
    } else {
      e.message = absl::StrCat("HTTP ", res.status, " for ", req.method, " ", req.path);
    }
    SendError(res, e);
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    spdlog::error("http: {} {}: {}", req.method, req.path, what);
    ApiError e;
    e.http_status = 500;
    e.type = "server_error";
    e.message = absl::StrCat("internal error: ", what);
    SendError(res, e);
  });

  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const admin::ClusterStatus s = manager_->Status();
    if (s.state() == admin::READY) {
      SendJson(res, 200, Json{{"status", "ok"}});
    } else {
      SendJson(res, 503, Json{{"status", admin::InstanceState_Name(s.state())},
                              {"reason", s.message().empty() ? "the instance is not ready" : s.message()}});
    }
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_->Render(manager_->Status(), manager_->metrics()) +
                        RenderExpertMetrics(*manager_), "text/plain; version=0.0.4");
  });
  auto model_json = [this](const std::string& name) {
    return Json{{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "flotilla"},
                {"root", options_.model_id}, {"max_model_len", MaxModelLen(manager_->options())}};
  };
  svr.Get("/v1/models", [this, model_json](const httplib::Request&, httplib::Response& res) {
    Json data = Json::array();
    for (const std::string& name : options_.served_model_names) data.push_back(model_json(name));
    SendJson(res, 200, Json{{"object", "list"}, {"data", std::move(data)}});
  });
  svr.Get(R"(/v1/models/(.+))", [this, model_json](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    if (ResolveModelName(options_.served_model_names, name) == name) {
      SendJson(res, 200, model_json(name));
    } else {
      SendError(res, absl::NotFoundError(absl::StrCat("model: the model '", std::string(req.matches[1]),
                                                      "' does not exist")));
    }
  });
  svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Serve(Endpoint::kChat, req, res);
  });
  svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Serve(Endpoint::kCompletions, req, res);
  });
  svr.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    ServeTokenize(false, req, res);
  });
  svr.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    ServeTokenize(true, req, res);
  });
}

const std::string& HttpServer::ModelFor(const Json& body) const {
  auto model = body.is_object() ? body.find("model") : body.end();
  if (model == body.end() || !model->is_string()) return options_.model_id;
  return ResolveModelName(options_.served_model_names, model->get_ref<const std::string&>());
}

void HttpServer::ServeTokenize(bool detokenize, const httplib::Request& req, httplib::Response& res) {
  absl::StatusOr<Json> json = ParseBody(req.body);
  if (!json.ok()) return SendError(res, json.status());
  TokenizeContext context{tok_, options_.harmony, ModelFor(*json), MaxModelLen(manager_->options()),
                          options_.limits.max_prompt_text_bytes};
  absl::StatusOr<Json> answer = detokenize ? Detokenize(*json, context) : Tokenize(*json, context);
  if (!answer.ok()) return SendError(res, answer.status());
  SendJson(res, 200, *answer);
}

std::string HttpServer::NewId(const char* prefix) { return absl::StrCat(prefix, RandomId()); }

void HttpServer::Serve(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  if (manager_->draining()) {  // stopping: refuse before reading any of it
    res.set_header("Retry-After", "5");
    return SendError(res, absl::UnavailableError(
                              "the server is shutting down: it finishes the requests in flight "
                              "and takes no new ones; retry on another server"));
  }
  absl::StatusOr<std::optional<absl::Time>> deadline = RequestDeadline(req, absl::Now());
  if (!deadline.ok()) return SendError(res, deadline.status());
  absl::StatusOr<Json> json = ParseBody(req.body);
  if (!json.ok()) return SendError(res, json.status());
  absl::StatusOr<PreparedRequest> prepared =
      endpoint == Endpoint::kChat
          ? PrepareChatRequest(*json, ModelFor(*json), *tok_, options_.harmony,
                               options_.limits.max_prompt_text_bytes)
          : PrepareCompletionRequest(*json, ModelFor(*json), *tok_,
                                     options_.limits.max_prompt_text_bytes);
  if (!prepared.ok()) return SendError(res, prepared.status());

  auto g = std::make_shared<Generation>();
  g->ex = std::make_shared<Exchange>();
  g->prompt_tokens = static_cast<uint32_t>(prepared->prompt.size());
  g->include_usage = prepared->include_usage;
  const int64_t created = absl::ToUnixSeconds(absl::Now());
  g->builder = std::make_unique<ResponseBuilder>(tok_, endpoint,
                                                 NewId(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-"),
                                                 options_.model_id, created, prepared->stop, prepared->logprobs);
  cluster::SubmitSequence submit;
  for (tokenizer::TokenId t : prepared->prompt) submit.add_prompt_ids(static_cast<int32_t>(t));
  *submit.mutable_sampling() = prepared->sampling;
  if (prepared->constraint) grammar::ToProto(*prepared->constraint, submit.mutable_constraint());
  if (*deadline) submit.set_deadline_unix_ms(absl::ToUnixMillis(**deadline));
  absl::StatusOr<uint64_t> id = manager_->Submit(std::move(submit), MakeCallbacks(g->ex));
  if (!id.ok()) return SendError(res, id.status());
  g->request_id = *id;
  ++metrics_->in_flight;

  if (!prepared->stream) {
    // Wait for the end, watching the connection: a client that goes away
    // cancels the request, and a deadline the workers missed ends it here.
    const int conn = ConnectionOf(req);
    absl::Status done_status;
    bool cancelled = false;
    while (true) {
      std::deque<cluster::SequenceUpdate> updates;
      bool done;
      {
        std::unique_lock<std::mutex> l(g->ex->mu);
        g->ex->cv.wait_for(l, std::chrono::milliseconds(100),
                           [&] { return !g->ex->updates.empty() || g->ex->done; });
        updates.swap(g->ex->updates);
        done = g->ex->done;
        done_status = g->ex->status;
      }
      Drain(*g, updates, manager_);
      if (done) break;
      if (!cancelled && PeerGone(conn)) {
        cancelled = true;
        manager_->Cancel(g->request_id, "the HTTP client disconnected");
      } else if (!cancelled && *deadline && absl::Now() > **deadline + absl::Seconds(1)) {
        cancelled = true;
        manager_->Cancel(g->request_id, "the request's deadline passed");
        --metrics_->in_flight;
        return SendError(res, absl::DeadlineExceededError("the request's deadline passed"));
      }
    }
    --metrics_->in_flight;
    absl::Status st = EndStatus(*g, done_status);
    if (!st.ok()) return SendError(res, st);
    return SendJson(res, 200, g->builder->Response());
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  ClusterManager* manager = manager_;
  HttpMetrics* metrics = metrics_.get();
  res.set_chunked_content_provider(
      "text/event-stream",
      [g, manager](size_t, httplib::DataSink& sink) {
        std::vector<Json> chunks;
        if (!g->begun) {
          g->begun = true;
          chunks = g->builder->Begin();
        }
        std::deque<cluster::SequenceUpdate> updates;
        bool done;
        absl::Status done_status;
        {
          std::unique_lock<std::mutex> l(g->ex->mu);
          if (chunks.empty()) {
            g->ex->cv.wait_for(l, std::chrono::milliseconds(100),
                               [&] { return !g->ex->updates.empty() || g->ex->done; });
          }
          updates.swap(g->ex->updates);
          done = g->ex->done;
          done_status = g->ex->status;
        }
        std::vector<Json> more = Drain(*g, updates, manager);
        chunks.insert(chunks.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
        std::string text;
        for (const Json& c : chunks) absl::StrAppend(&text, "data: ", DumpJson(c), "\n\n");
        if (done || g->finished) {
          absl::Status st = EndStatus(*g, done_status);
          if (!st.ok()) {
            absl::StrAppend(&text, "data: ", DumpJson(ErrorJson(ErrorFromStatus(st))), "\n\n");
          } else if (g->include_usage) {
            absl::StrAppend(&text, "data: ", DumpJson(g->builder->UsageChunk()), "\n\n");
          }
          text += "data: [DONE]\n\n";
          if (!sink.write(text.data(), text.size())) return false;
          g->ended = true;
          sink.done();
          return true;
        }
        if (!text.empty()) return sink.write(text.data(), text.size());
        return sink.is_writable();
      },
      [g, manager, metrics](bool success) {
        if (!g->ended || !g->ex->done) {
          // The client went away before the end (or the stream is done but the
          // worker has not confirmed): free the sequence.
          bool done;
          {
            std::lock_guard<std::mutex> l(g->ex->mu);
            done = g->ex->done;
          }
          if (!done) manager->Cancel(g->request_id, "the HTTP client disconnected");
        }
        --metrics->in_flight;
      });
}

}  // namespace flotilla::coordinator
