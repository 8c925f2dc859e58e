#include "coordinator/http/http_server.h"

#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/build_info.h"
#include "common/listen_address.h"
#include "coordinator/cluster/expert_metrics.h"
#include "coordinator/http/held_stream.h"
#include "coordinator/http/openai_pipeline.h"
#include "coordinator/http/tokenize_api.h"
#include "coordinator/request_registry.h"
#include "coordinator/request_session.h"
#include "coordinator/served_models.h"
#include "coordinator/session_request.h"
#include "spdlog/spdlog.h"

namespace flotilla::coordinator {

// ---- metrics ----

namespace {

// A series' labels in braces, or nothing.
std::string Braces(const std::string& labels) { return labels.empty() ? "" : "{" + labels + "}"; }

void Gauge(std::string& out, const std::string& name, const std::string& help, const std::string& labels,
           double v) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n", name, Braces(labels),
                  " ", v, "\n");
}
void Counter(std::string& out, const std::string& name, const std::string& help,
             const std::string& labels, uint64_t v) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " counter\n", name,
                  Braces(labels), " ", v, "\n");
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

  // Every series carries model_name="`model_id`" (as vLLM's do).
  std::string Render(const admin::ClusterStatus& s, const ClusterManager& manager,
                     const std::string& model_id) const {
    const std::string m = ModelLabel(model_id);
    std::string out;
    out += "# HELP flotilla_http_requests_total HTTP requests answered, by path and status\n"
           "# TYPE flotilla_http_requests_total counter\n";
    {
      std::lock_guard<std::mutex> l(mu_);
      for (const auto& [key, n] : requests_) {
        absl::StrAppend(&out, "flotilla_http_requests_total{", m, ",path=\"", PrometheusLabelValue(key.first),
                        "\",status=\"", key.second, "\"} ", n, "\n");
      }
    }
    manager.RenderServingMetrics(m, out);
    Gauge(out, "flotilla_http_requests_in_flight", "generation requests being served over HTTP", m,
          static_cast<double>(in_flight.load()));
    Gauge(out, "flotilla_http_connections", "open connections of the HTTP API", m,
          static_cast<double>(connections ? connections() : 0));
    if (buffers) {
      Gauge(out, "flotilla_client_buffer_bytes",
            "bytes queued toward clients, not yet taken by them (gRPC and HTTP)", m,
            static_cast<double>(buffers->queued()));
      Gauge(out, "flotilla_client_requests_open",
            "generation requests admitted whose answer is not yet delivered (gRPC and HTTP; "
            "--max-inflight)",
            m, static_cast<double>(buffers->open_requests()));
      Counter(out, "flotilla_client_streams_ended_total",
              "streams ended because their clients did not read them", m,
              buffers->streams_ended());
    }
    Counter(out, "flotilla_requests_submitted_total", "requests admitted (gRPC and HTTP)", m,
            s.requests_submitted());
    Counter(out, "flotilla_requests_cancelled_total",
            "requests ended early by a cancel, a client disconnect or a stop string", m,
            s.requests_cancelled());
    Gauge(out, "flotilla_requests_in_flight", "requests the coordinator is serving (gRPC and HTTP)", m,
          static_cast<double>(s.requests_in_flight()));
    out += "# HELP flotilla_instance_ready 1 while the instance takes requests\n"
           "# TYPE flotilla_instance_ready gauge\n";
    for (const admin::InstanceStatus& i : s.instances()) {
      absl::StrAppend(&out, "flotilla_instance_ready{", m, ",instance=\"", i.id(), "\"} ",
                      i.state() == admin::READY && !i.drained() ? 1 : 0, "\n");
    }

    uint64_t running = 0, queued = 0, kv_free = 0, kv_total = 0;
    uint64_t prefix_queries = 0, prefix_hits = 0;
    uint64_t host_hits = 0, host_to_host = 0, host_to_device = 0;
    uint64_t spec_drafted = 0, spec_accepted = 0, spec_steps = 0;
    std::string per_worker;
    for (const admin::WorkerStatus& w : s.workers()) {
      running += w.load().running_sequences();
      queued += w.load().queued_sequences();
      kv_free += w.load().kv_blocks_free();
      kv_total += w.load().kv_blocks_total();
      prefix_queries += w.load().prefix_cache_queries_tokens();
      prefix_hits += w.load().prefix_cache_hits_tokens();
      host_hits += w.load().kv_host_hit_blocks();
      host_to_host += w.load().kv_host_bytes_to_host();
      host_to_device += w.load().kv_host_bytes_to_device();
      spec_drafted += w.load().spec_drafted_tokens();
      spec_accepted += w.load().spec_accepted_tokens();
      spec_steps += w.load().spec_verify_steps();
      const double usage = w.load().kv_blocks_total() == 0
                               ? 0.0
                               : 1.0 - static_cast<double>(w.load().kv_blocks_free()) /
                                           static_cast<double>(w.load().kv_blocks_total());
      absl::StrAppend(&per_worker, "flotilla_worker_kv_cache_usage_ratio{", m, ",instance=\"",
                      w.instance(), "\",worker=\"", PrometheusLabelValue(w.worker_id()),
                      "\",rank=\"", w.rank(), "\"} ", usage, "\n");
    }
    Gauge(out, "flotilla_running_sequences", "sequences running on the workers", m,
          static_cast<double>(running));
    Gauge(out, "flotilla_queued_sequences", "sequences waiting on the workers (queue depth)", m,
          static_cast<double>(queued));
    Gauge(out, "flotilla_kv_blocks_free", "free KV cache blocks over all workers", m,
          static_cast<double>(kv_free));
    Gauge(out, "flotilla_kv_blocks_capacity", "KV cache blocks over all workers, used or free", m,
          static_cast<double>(kv_total));
    Gauge(out, "flotilla_kv_cache_usage_ratio", "used fraction of the KV cache over all workers", m,
          kv_total == 0 ? 0.0 : 1.0 - static_cast<double>(kv_free) / static_cast<double>(kv_total));
    // Sums of the workers' counters since each started (a restarted worker
    // starts again from zero: Prometheus treats that as a counter reset).
    Counter(out, "flotilla_prefix_cache_queries_tokens_total",
            "prompt tokens looked up in the workers' prefix caches", m, prefix_queries);
    Counter(out, "flotilla_prefix_cache_hits_tokens_total",
            "prompt tokens found in the workers' prefix caches (not computed)", m, prefix_hits);
    Counter(out, "flotilla_kv_host_tier_hit_blocks_total",
            "KV blocks a prefix hit copied back from the workers' host-memory tiers", m, host_hits);
    Counter(out, "flotilla_kv_host_tier_bytes_to_host_total",
            "bytes of evicted cached KV blocks copied to the workers' host-memory tiers", m,
            host_to_host);
    Counter(out, "flotilla_kv_host_tier_bytes_to_device_total",
            "bytes copied back from the workers' host-memory tiers", m, host_to_device);
    Counter(out, "flotilla_spec_decode_num_draft_tokens_total",
            "tokens drafted for speculative decoding", m, spec_drafted);
    Counter(out, "flotilla_spec_decode_num_accepted_tokens_total",
            "drafted tokens the model accepted", m, spec_accepted);
    Counter(out, "flotilla_spec_decode_num_verify_steps_total",
            "decode steps that verified a draft", m, spec_steps);
    // Tokens a verification step produces on average: the accepted drafted
    // ones and the model's own after them.
    Gauge(out, "flotilla_spec_decode_mean_acceptance_length",
          "tokens per verification step since the workers started (accepted + 1; 0: none)", m,
          spec_steps == 0
              ? 0.0
              : 1.0 + static_cast<double>(spec_accepted) / static_cast<double>(spec_steps));
    out += "# HELP flotilla_worker_kv_cache_usage_ratio used fraction of one worker's KV cache\n"
           "# TYPE flotilla_worker_kv_cache_usage_ratio gauge\n";
    out += per_worker;
    return out;
  }
  // The API listener's open connections (set once it exists).
  std::function<int()> connections;
  // Flow control toward clients (null: none).
  std::shared_ptr<ClientBuffers> buffers;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
};


namespace {

void SendJson(HttpResponse& res, int status, const Json& j) {
  res.status = status;
  res.set_content(DumpJson(j), "application/json");
}

void SendError(HttpResponse& res, const ApiError& e) { SendJson(res, e.http_status, ErrorJson(e)); }
void SendError(HttpResponse& res, const absl::Status& st) { SendError(res, ErrorFromStatus(st)); }

// One HTTP generation: the serializer of a RequestSession's events. The
// session decodes on a transport thread (its `run` hook is the exchange's
// Defer), never on the gRPC thread that delivers a worker's tokens and
// heartbeats.
struct Generation : HttpAnswer {
  std::unique_ptr<ResponseBuilder> builder;
  bool include_usage = false;  // `begun`: the head and Begin() chunks went out
};

std::string ChunkEvents(const std::vector<Json>& chunks) {
  std::string text;
  for (const Json& c : chunks) absl::StrAppend(&text, "data: ", DumpJson(c), "\n\n");
  return text;
}

// Ends the response (under g.mu): the stream's last events, or the whole
// answer, for `st` (OK: finished normally).
void EndChatLocked(Generation& g, const absl::Status& st) {
  if (g.ended) return;
  g.ended = true;
  if (g.stream) {
    std::string text;
    if (!st.ok()) {
      absl::StrAppend(&text, "data: ", DumpJson(ErrorJson(ErrorFromStatus(st))), "\n\n");
    } else if (g.include_usage) {
      absl::StrAppend(&text, "data: ", DumpJson(g.builder->UsageChunk()), "\n\n");
    }
    text += "data: [DONE]\n\n";
    EmitLocked(g, std::move(text));
    if (g.begun) g.exchange->End();
    return;
  }
  HttpResponse res;
  if (!st.ok()) {
    res = ErrorResponse(ErrorFromStatus(st));
  } else {
    SendJson(res, 200, g.builder->Response());
  }
  g.TagIgnored(res);
  g.exchange->Send(std::move(res));
}

// The request's deadline from X-Request-Timeout or X-Stainless-Timeout
// (seconds, > 0); nullopt when neither is set.
absl::StatusOr<std::optional<absl::Time>> RequestDeadline(const HttpRequest& req, absl::Time now) {
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

// The path label of a request in flotilla_http_requests_total.
std::string PathLabel(const std::string& path) {
  static const char* kKnown[] = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/health",
                                 "/metrics", "/tokenize", "/detokenize", "/ping", "/version"};
  for (const char* k : kKnown) {
    if (path == k) return k;
  }
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  if (path.rfind("/v1/responses/", 0) == 0) return "/v1/responses/{id}";
  return "other";
}

}  // namespace

// ---- server ----

HttpServer::HttpServer(HttpServerOptions options, ClusterManager* manager,
                       const tokenizer::Tokenizer* tokenizer)
    : options_(std::move(options)),
      manager_(manager),
      backend_(manager),
      tok_(tokenizer),
      metrics_(std::make_unique<HttpMetrics>()) {
  if (options_.served_model_names.empty()) options_.served_model_names = {options_.model_id};
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop(absl::Duration grace) {
  // The transport first (no new requests, no handler running), then what is
  // still generating: its callbacks hold connections.
  if (server_) server_->Stop(grace);
  if (metrics_server_) metrics_server_->Stop();
  std::set<uint64_t> active;
  {
    std::lock_guard<std::mutex> l(active_mu_);
    active.swap(active_);
  }
  for (uint64_t id : active) manager_->Cancel(id, "the HTTP server is stopping");
}

void HttpServer::Track(uint64_t request_id) {
  std::lock_guard<std::mutex> l(active_mu_);
  active_.insert(request_id);
}

void HttpServer::Untrack(uint64_t request_id) {
  std::lock_guard<std::mutex> l(active_mu_);
  active_.erase(request_id);
}

HttpTransportOptions HttpServer::TransportOptions(const std::string& listen, const char* flag) const {
  HttpTransportOptions t;
  t.listen = listen;
  t.flag = flag;
  t.max_body_bytes = options_.limits.max_request_bytes == 0 ? std::numeric_limits<size_t>::max()
                                                            : options_.limits.max_request_bytes;
  t.connections = options_.connections;
  t.client_buffers = options_.client_buffers;
  return t;
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(HttpServerOptions options,
                                                               ClusterManager* manager,
                                                               const tokenizer::Tokenizer* tokenizer) {
  if (options.tls.enabled()) {
    if (absl::Status st = CheckServerFiles(options.tls); !st.ok()) return st;
  }
  std::unique_ptr<HttpServer> s(new HttpServer(std::move(options), manager, tokenizer));
  HttpTransportOptions t = s->TransportOptions(s->options_.listen, "--http-listen");
  t.tls = s->options_.tls;
  absl::StatusOr<std::unique_ptr<HttpTransport>> server = HttpTransport::Create(std::move(t));
  if (!server.ok()) return server.status();
  s->server_ = *std::move(server);
  s->port_ = s->server_->port();
  HttpTransport* transport = s->server_.get();
  s->metrics_->connections = [transport] { return transport->connections(); };
  s->metrics_->buffers = s->options_.client_buffers;
  absl::StatusOr<std::unique_ptr<ResponseStore>> store = ResponseStore::Create(s->options_.responses_store);
  if (!store.ok()) return store.status();
  s->responses_store_ = *std::move(store);
  absl::StatusOr<std::unique_ptr<ReasoningCipher>> cipher =
      s->options_.reasoning_key_file.empty()
          ? ReasoningCipher::Random()
          : ReasoningCipher::FromFile(s->options_.reasoning_key_file);
  if (!cipher.ok()) return cipher.status();
  s->reasoning_cipher_ = *std::move(cipher);
  s->responses_ = ResponsesHttpContext{&s->backend_,
                                       tokenizer,
                                       s->responses_store_.get(),
                                       s->options_.model_id,
                                       s->options_.served_model_names,
                                       s->options_.harmony,
                                       s->options_.limits.max_prompt_text_bytes,
                                       &s->metrics_->in_flight,
                                       s->options_.cache_domains,
                                       s->reasoning_cipher_.get(),
                                       s->options_.unknown_fields};
  s->Routes();
  s->server_->Start();
  if (!s->options_.metrics_listen.empty()) {
    absl::Status metrics = s->ServeMetrics();
    if (!metrics.ok()) return metrics;  // the destructor stops the API listener
  }
  return s;
}

absl::Status HttpServer::ServeMetrics() {
  HttpTransportOptions t = TransportOptions(options_.metrics_listen, "--metrics-listen");
  t.post_threads = 1;
  absl::StatusOr<std::unique_ptr<HttpTransport>> server = HttpTransport::Create(std::move(t));
  if (!server.ok()) return server.status();
  metrics_server_ = *std::move(server);
  metrics_server_->Get("/metrics", [this](const HttpRequest&, HttpResponse& res) {
    res.set_content(metrics_->Render(manager_->Status(), *manager_, options_.model_id) +
                        RenderExpertMetrics(*manager_, ModelLabel(options_.model_id)),
                    "text/plain; version=0.0.4");
  });
  metrics_server_->set_logger([](const HttpRequest& req, const HttpResponse& res, bool) {
    if (!req.access) return;
    req.access->set_level(spdlog::level::debug);
    req.access->Log(absl::StrCat(res.status), absl::Now());
  });
  metrics_port_ = metrics_server_->port();
  metrics_server_->Start();
  return absl::OkStatus();
}

bool HttpServer::Authorized(const HttpRequest& req, HttpResponse& res) const {
  if (options_.auth == nullptr || req.path == "/health" || req.path == "/ping") return true;
  absl::StatusOr<Caller> caller =
      options_.auth->Authenticate(req.get_header_value("Authorization"));
  if (caller.ok() && req.path == "/metrics" && caller->role == Caller::Role::kClient &&
      !options_.metrics_for_clients) {
    ApiError e;
    e.http_status = 403;
    e.type = "permission_error";
    e.code = "admin_key_required";
    e.message =
        "GET /metrics needs the admin key (or scrape the --metrics-listen port; "
        "--metrics-for-clients opens it to client keys)";
    SendError(res, e);
    return false;
  }
  if (caller.ok()) {
    if (req.access) req.access->set_key(caller->key_id);
    return true;
  }
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

std::string HttpServer::CallerKeyId(const HttpRequest& req) const {
  if (options_.auth == nullptr) return "";
  absl::StatusOr<Caller> caller = options_.auth->Authenticate(req.get_header_value("Authorization"));
  return caller.ok() ? caller->key_id : "";
}

void HttpServer::Routes() {
  HttpTransport& svr = *server_;
  // A browser's preflight carries no key: it is answered before the check.
  svr.set_pre_routing_handler([this](const HttpRequest& req, HttpResponse& res) {
    return options_.cors.AnswerPreflight(req, res) || !Authorized(req, res);
  });
  if (options_.cors.enabled()) {
    svr.set_response_decorator(
        [this](const HttpRequest& req, HttpResponse& res) { options_.cors.Decorate(req, res); });
  }

  svr.set_logger([this](const HttpRequest& req, const HttpResponse& res, bool complete) {
    const std::string path = PathLabel(req.path);
    metrics_->CountRequest(path, res.status);
    if (!req.access) return;
    if (path == "/health" || path == "/metrics" || path == "/ping") {
      req.access->set_level(spdlog::level::debug);
    }
    if (!complete) req.access->set_finish_reason("client_gone");
    req.access->Log(absl::StrCat(res.status), absl::Now());
  });
  svr.set_error_handler([this](const HttpRequest& req, HttpResponse& res) {
    ApiError e;
    e.http_status = res.status;
    e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
    if (res.status == 404) {
      e.message = absl::StrCat("unknown path: ", req.method, " ", req.path);
      e.code = "unknown_url";
    } else if (res.status == 405) {
      e.message = absl::StrCat("method ", req.method, " is not allowed on ", req.path);
      e.code = "method_not_allowed";
    } else if (res.status == 413) {
      e.message = absl::StrCat("the request body is too large (this server's limit is ",
                               options_.limits.max_request_bytes, " bytes: --max-request-bytes)");
    } else if (res.status == 408) {
      e.message = "the request did not arrive in time (--http-header-timeout-s, --http-body-timeout-s)";
      e.type = "timeout_error";
    } else if (res.status == 503 && req.method.empty()) {
      e.message = absl::StrCat("too many connections (", options_.connections.max_connections,
                               ", --http-max-connections); retry later");
    } else if (res.status == 400 || res.status == 431) {
      e.message = absl::StrCat("malformed HTTP request", res.status == 431 ? " (headers too large)" : "");
    } else {
      e.message = absl::StrCat("HTTP ", res.status, " for ", req.method, " ", req.path);
    }
    SendError(res, e);
  });

  svr.Get("/health", [this](const HttpRequest&, HttpResponse& res) {
    // Draining: not ready, so load balancers and readiness probes move on.
    if (manager_->draining()) {
      res.set_header("Retry-After", "5");
      return SendJson(res, 503, Json{{"status", "DRAINING"},
                                     {"reason", "the server is shutting down: it finishes the "
                                                "requests in flight and takes no new ones"}});
    }
    const admin::ClusterStatus s = manager_->Status();
    Json instances = Json::array();
    bool serving = false;
    for (const admin::InstanceStatus& i : s.instances()) {
      const bool takes = i.state() == admin::READY && !i.drained();
      serving = serving || takes;
      instances.push_back(Json{{"instance", i.id()},
                               {"status", i.drained() ? std::string("DRAINED")
                                                      : admin::InstanceState_Name(i.state())},
                               {"reason", i.message()}});
    }
    if (serving) {
      SendJson(res, 200, Json{{"status", "ok"}, {"instances", instances}});
    } else {
      SendJson(res, 503, Json{{"status", admin::InstanceState_Name(s.state())},
                              {"reason", s.message().empty() ? "the instance is not ready" : s.message()},
                              {"instances", instances}});
    }
  });
  // The process is up and answering (whatever the instance's state: /health
  // says that).
  svr.Get("/ping", [](const HttpRequest&, HttpResponse& res) { res.set_content("", "text/plain"); });
  svr.Get("/version", [](const HttpRequest&, HttpResponse& res) {
    const BuildInfo& b = GetBuildInfo();
    SendJson(res, 200, Json{{"version", b.version}, {"build_type", b.build_type}, {"cuda", b.cuda},
                            {"nccl", b.nccl}, {"ucx", b.ucx}, {"sanitize", b.sanitize}});
  });
  svr.Get("/metrics", [this](const HttpRequest&, HttpResponse& res) {
    res.set_content(metrics_->Render(manager_->Status(), *manager_, options_.model_id) +
                        RenderExpertMetrics(*manager_, ModelLabel(options_.model_id)),
                    "text/plain; version=0.0.4");
  });
  auto model_json = [this](const std::string& name) {
    return Json{{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "flotilla"},
                {"root", options_.model_id}, {"max_model_len", MaxModelLen(manager_->options())}};
  };
  svr.Get("/v1/models", [this, model_json](const HttpRequest&, HttpResponse& res) {
    Json data = Json::array();
    for (const std::string& name : options_.served_model_names) data.push_back(model_json(name));
    SendJson(res, 200, Json{{"object", "list"}, {"data", std::move(data)}});
  });
  svr.Get(R"(/v1/models/(.+))", [this, model_json](const HttpRequest& req, HttpResponse& res) {
    const std::string name = req.matches[1];
    if (ResolveModelName(options_.served_model_names, name) == name) {
      SendJson(res, 200, model_json(name));
    } else {
      SendError(res, absl::NotFoundError(absl::StrCat("model: the model '", req.matches[1],
                                                      "' does not exist")));
    }
  });
  svr.Post("/v1/chat/completions", HttpTransport::AsyncHandler([this](std::shared_ptr<HttpExchange> ex) {
             Serve(Endpoint::kChat, std::move(ex));
           }));
  svr.Post("/v1/completions", HttpTransport::AsyncHandler([this](std::shared_ptr<HttpExchange> ex) {
             Serve(Endpoint::kCompletions, std::move(ex));
           }));
  svr.Post("/v1/responses", HttpTransport::AsyncHandler([this](std::shared_ptr<HttpExchange> ex) {
             ServeResponsesRoute(std::move(ex));
           }));
  svr.Get(R"(/v1/responses/([^/]+))", [this](const HttpRequest& req, HttpResponse& res) {
    res = RetrieveResponse(responses_, req.matches[1], CallerKeyId(req), req.target);
  });
  svr.Post(R"(/v1/responses/([^/]+)/cancel)", [this](const HttpRequest& req, HttpResponse& res) {
    res = CancelResponse(responses_, req.matches[1], CallerKeyId(req));
  });
  svr.Delete(R"(/v1/responses/([^/]+))", [this](const HttpRequest& req, HttpResponse& res) {
    res = DeleteResponse(responses_, req.matches[1], CallerKeyId(req));
  });
  svr.Post("/tokenize", [this](const HttpRequest& req, HttpResponse& res) {
    ServeTokenize(false, req, res);
  });
  svr.Post("/detokenize", [this](const HttpRequest& req, HttpResponse& res) {
    ServeTokenize(true, req, res);
  });
}

const std::string& HttpServer::ModelFor(const Json& body) const {
  auto model = body.is_object() ? body.find("model") : body.end();
  if (model == body.end() || !model->is_string()) return options_.model_id;
  return ResolveModelName(options_.served_model_names, model->get_ref<const std::string&>());
}

void HttpServer::ServeTokenize(bool detokenize, const HttpRequest& req, HttpResponse& res) {
  absl::StatusOr<Json> json = ParseBody(req.body);
  if (!json.ok()) return SendError(res, json.status());
  TokenizeContext context{tok_, options_.harmony, ModelFor(*json), MaxModelLen(manager_->options()),
                          options_.limits.max_prompt_text_bytes};
  absl::StatusOr<Json> answer = detokenize ? Detokenize(*json, context) : Tokenize(*json, context);
  if (!answer.ok()) return SendError(res, answer.status());
  SendJson(res, 200, *answer);
}

void HttpServer::ServeResponsesRoute(std::shared_ptr<HttpExchange> exchange) {
  if (!Admit(*exchange)) return;
  absl::StatusOr<std::optional<absl::Time>> deadline = RequestDeadline(exchange->request(), absl::Now());
  if (!deadline.ok()) return exchange->Send(ErrorResponse(ErrorFromStatus(deadline.status())));
  SessionHooks hooks = SessionHooksFor(exchange);
  const std::string owner = CallerKeyId(exchange->request());
  ServeResponses(responses_, std::move(exchange), owner, *deadline, std::move(hooks));
}

bool HttpServer::Admit(HttpExchange& exchange) {
  if (manager_->draining()) {  // stopping: refuse (what was read of it is dropped)
    HttpResponse res = ErrorResponse(ErrorFromStatus(absl::UnavailableError(
        "the server is shutting down: it finishes the requests in flight and takes no new ones; "
        "retry on another server")));
    res.set_header("Retry-After", "5");
    exchange.Send(std::move(res));
    return false;
  }
  if (!options_.client_buffers) return true;
  absl::StatusOr<std::shared_ptr<void>> admitted = options_.client_buffers->Admit();
  if (!admitted.ok()) {
    HttpResponse res = ErrorResponse(ErrorFromStatus(admitted.status()));
    res.set_header("Retry-After", "1");
    exchange.Send(std::move(res));
    return false;
  }
  exchange.Hold(*std::move(admitted));
  return true;
}

std::string HttpServer::NewId(const char* prefix) { return absl::StrCat(prefix, RandomId()); }

SessionHooks HttpServer::SessionHooksFor(const std::shared_ptr<HttpExchange>& exchange) {
  HttpMetrics* metrics = metrics_.get();
  SessionHooks hooks;
  hooks.run = [exchange](std::function<void()> task) { exchange->Defer(std::move(task)); };
  hooks.after = [exchange](absl::Duration delay, std::function<void()> task) {
    exchange->After(delay, std::move(task));
  };
  hooks.on_accepted = [this](uint64_t request_id) { Track(request_id); };
  hooks.on_released = [this](uint64_t request_id) { Untrack(request_id); };
  hooks.on_all_released = [metrics] { --metrics->in_flight; };
  return hooks;
}

void HttpServer::Serve(Endpoint endpoint, std::shared_ptr<HttpExchange> exchange) {
  const HttpRequest& req = exchange->request();
  auto fail = [&](const absl::Status& st) { exchange->Send(ErrorResponse(ErrorFromStatus(st))); };
  if (!Admit(*exchange)) return;
  absl::StatusOr<std::optional<absl::Time>> deadline = RequestDeadline(req, absl::Now());
  if (!deadline.ok()) return fail(deadline.status());
  absl::StatusOr<Json> json = ParseBody(req.body);
  if (!json.ok()) return fail(json.status());
  absl::StatusOr<PreparedRequest> prepared =
      endpoint == Endpoint::kChat
          ? PrepareChatRequest(*json, ModelFor(*json), *tok_, options_.harmony,
                               options_.limits.max_prompt_text_bytes, options_.unknown_fields)
          : PrepareCompletionRequest(*json, ModelFor(*json), *tok_,
                                     options_.limits.max_prompt_text_bytes, options_.unknown_fields);
  if (!prepared.ok()) return fail(prepared.status());

  auto g = std::make_shared<Generation>();
  g->Open(exchange, prepared->ignored_fields);
  g->stream = prepared->stream;
  g->include_usage = prepared->include_usage;
  const std::string id = NewId(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
  g->access->set_request_id(id);
  const int64_t created = absl::ToUnixSeconds(absl::Now());
  // prompt_cache_key, else the x-session-id header: routed together.
  SessionContext context;
  context.call_id_seed = id;
  context.deadline = *deadline;
  context.cache_domain =
      CacheDomain(prepared->cache_salt, CallerKeyId(exchange->request()), options_.cache_domains);
  context.default_route_key = exchange->request().get_header_value("x-session-id");
  SessionRequest request = SessionRequestOf(*prepared, std::move(context));
  const uint32_t choices = static_cast<uint32_t>(request.prompts.size()) * request.n;
  uint32_t prompt_tokens = 0;
  for (const std::vector<tokenizer::TokenId>& prompt : request.prompts) {
    prompt_tokens += static_cast<uint32_t>(prompt.size());
  }
  g->access->set_prompt_tokens(prompt_tokens);
  g->builder = std::make_unique<ResponseBuilder>(tok_, endpoint, id, options_.model_id, created,
                                                 prepared->stop, prepared->logprobs, choices);
  g->builder->set_reasoning_field(options_.reasoning_field);
  g->builder->set_streaming(g->stream);

  ++metrics_->in_flight;
  absl::StatusOr<std::shared_ptr<RequestSession>> started = RequestSession::Start(
      &backend_, tok_, std::move(request),
      [g](const std::vector<RequestEvent>& events) {
        ConsumeEvents(*g, events, ChunkEvents, EndChatLocked);
      },
      SessionHooksFor(exchange));
  if (!started.ok()) {
    --metrics_->in_flight;
    ApiError e = ErrorFromStatus(started.status());
    if (e.code == kContextLengthExceeded) e.param = endpoint == Endpoint::kChat ? "messages" : "prompt";
    HttpResponse res;
    SendError(res, e);
    return exchange->Send(std::move(res));
  }
  std::shared_ptr<RequestSession> session = *std::move(started);

  if (g->stream) {
    HttpResponse head;
    head.content_type = "text/event-stream";
    head.set_header("Cache-Control", "no-cache");
    head.set_header("X-Accel-Buffering", "no");
    g->TagIgnored(head);
    std::lock_guard<std::mutex> l(g->mu);
    exchange->BeginStream(std::move(head));
    std::string text = ChunkEvents(g->builder->Begin()) + g->held;
    g->held.clear();
    g->begun = true;
    if (!text.empty()) exchange->Write(std::move(text));
    if (g->ended) exchange->End();
  }
  // A client that goes away cancels its request.
  exchange->OnClientGone([session] { session->Cancel("the HTTP client disconnected"); });
}

}  // namespace flotilla::coordinator
