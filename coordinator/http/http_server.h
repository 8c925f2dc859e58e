// The OpenAI-compatible HTTP API of the coordinator (on HttpTransport:
// Boost.Beast, event-driven; see http_transport.h for what no client can do to it):
//   POST /v1/chat/completions, POST /v1/completions (JSON or SSE streams),
//   POST /v1/responses, GET and DELETE /v1/responses/{id}, POST
//   /v1/responses/{id}/cancel (the Responses API: responses_http.h),
//   GET /v1/models, GET /health, GET /metrics (Prometheus text), GET /ping
//   (200 while the process answers), GET /version (build info), and vLLM's
//   POST /tokenize and POST /detokenize.
// With API keys every path but /health and /ping needs "Authorization: Bearer
// KEY" (401 otherwise); /metrics can also be served, open, on its own listener.
// CORS is off unless --allowed-origins lists origins (cors.h): then their
// preflights are answered before the key check and every answer to them,
// errors and streams included, carries Access-Control-Allow-Origin.
// Requests run as RequestSessions on ClusterManager; a client that disconnects (streamed
// or not) cancels its request. A request's deadline comes from the
// X-Request-Timeout header (seconds), else X-Stainless-Timeout (what the
// official OpenAI clients send for their `timeout`); past it the answer is 504.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/harmony/openai.h"
#include "common/tls_credentials.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/auth.h"
#include "coordinator/cache_domain.h"
#include "coordinator/cluster/cluster_manager.h"
#include "coordinator/http/cors.h"
#include "coordinator/http/http_transport.h"
#include "coordinator/http/openai_pipeline.h"
#include "coordinator/http/response_store.h"
#include "coordinator/http/responses_http.h"
#include "coordinator/input_limits.h"
#include "coordinator/request_session.h"

namespace flotilla::coordinator {

struct HttpServerOptions {
  std::string listen = "127.0.0.1:8000";  // host:port; port 0 = any free port
  std::string model_id;                   // the model name clients use
  // Every name requests may use (ServedModelNames: --served-model-name, else
  // model_id alone); replies carry model_id, /v1/models lists each.
  std::vector<std::string> served_model_names;
  harmony::OpenAiRequestOptions harmony;  // system message defaults
  const Authenticator* auth = nullptr;    // null = open; must outlive the server
  // host:port of a second listener serving only GET /metrics, without a key
  // (port 0 = any); empty = none.
  std::string metrics_listen;
  // GET /metrics on the API listener answers client keys too (its counters,
  // prefix-cache hits among them, tell about other tenants' requests); by
  // default only the admin key (or anyone when the server has no keys).
  bool metrics_for_clients = false;
  // Origins browsers may call the API from (--allowed-origins; cors.h).
  CorsPolicy cors;
  // Which requests share cached prompt blocks (cache_domain.h).
  CacheDomainPolicy cache_domains;
  // Request fields this server does not know (request_fields.h): ignored,
  // named in the x-flotilla-ignored-fields header and a log line, or refused
  // (--strict-request-fields).
  UnknownFields unknown_fields = UnknownFields::kIgnore;
  // Where chat replies carry reasoning text (--reasoning-field).
  ReasoningField reasoning_field = ReasoningField::kBoth;
  // Bodies over limits.max_request_bytes get 413 unread; prompts over
  // limits.max_prompt_text_bytes 400 untokenised.
  InputLimits limits;
  // With tls.cert and tls.key the API is HTTPS only; with tls.client_ca too,
  // clients must present a certificate that CA signed (mTLS).
  TlsServerFiles tls;
  // Connections and their timeouts, on every listener (the API's and the
  // metrics one).
  HttpConnectionLimits connections;
  // What /v1/responses keeps for previous_response_id.
  ResponseStoreOptions responses_store;
  // --reasoning-key-file: the keys of /v1/responses' encrypted_content
  // (responses_cipher.h); empty: a random key of this process.
  std::string reasoning_key_file;
  // Flow control toward clients (client_buffers.h): generations are admitted
  // by it and every response's unwritten bytes counted in it. Null: none.
  std::shared_ptr<ClientBuffers> client_buffers;
};

class HttpMetrics;

class HttpServer {
 public:
  // Binds and starts serving on its own threads. `manager` and `tokenizer`
  // must outlive the server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Create(HttpServerOptions options,
                                                            ClusterManager* manager,
                                                            const tokenizer::Tokenizer* tokenizer);
  ~HttpServer();

  // The bound port.
  int port() const { return port_; }
  // The bound port of the metrics listener (0 when there is none).
  int metrics_port() const { return metrics_port_; }
  // Open connections of the API listener.
  int connections() const { return server_ ? server_->connections() : 0; }
  // Stops accepting, gives the responses under way up to `grace` to be
  // written (after a drain: the last events of streams that just ended),
  // then closes every connection and cancels the requests still running.
  void Stop(absl::Duration grace = absl::ZeroDuration());

 private:
  HttpServer(HttpServerOptions options, ClusterManager* manager, const tokenizer::Tokenizer* tokenizer);
  void Routes();
  // Runs one chat or completions request, streamed or whole: prepares and
  // submits it, then answers from the manager's callbacks (no thread waits).
  void Serve(Endpoint endpoint, std::shared_ptr<HttpExchange> exchange);
  // POST /v1/responses: the checks every generation route makes, then ServeResponses.
  void ServeResponsesRoute(std::shared_ptr<HttpExchange> exchange);
  // /tokenize (`detokenize` false) or /detokenize.
  void ServeTokenize(bool detokenize, const HttpRequest& req, HttpResponse& res);
  // Where a generation's session runs (the exchange's transport threads and
  // timers) and the bookkeeping of its sequences (Stop cancels them; the
  // in-flight gauge counts it until none is left).
  SessionHooks SessionHooksFor(const std::shared_ptr<HttpExchange>& exchange);
  // The name a request's `model` is checked against: itself when served.
  const std::string& ModelFor(const Json& body) const;
  std::string NewId(const char* prefix);
  // Whether a new generation may start: not while the server drains (answers
  // 503 itself) and only when the client buffers admit it (counted open until
  // its response is written; answers 429 itself otherwise).
  bool Admit(HttpExchange& exchange);
  // Whether `req` may go on; answers 401 (no or a wrong key) or 403 (a
  // client key on an admin route) itself otherwise.
  bool Authorized(const HttpRequest& req, HttpResponse& res) const;
  // The caller's key id ("client:3"; empty without keys): what owns the
  // responses it stores. Only for requests Authorized let through.
  std::string CallerKeyId(const HttpRequest& req) const;
  // Starts the open /metrics listener on options_.metrics_listen.
  absl::Status ServeMetrics();
  HttpTransportOptions TransportOptions(const std::string& listen, const char* flag) const;
  // The requests in flight, cancelled by Stop.
  void Track(uint64_t request_id);
  void Untrack(uint64_t request_id);

  HttpServerOptions options_;
  ClusterManager* manager_;
  ClusterBackend backend_;  // manager_ as the sessions' backend
  const tokenizer::Tokenizer* tok_;
  std::unique_ptr<HttpMetrics> metrics_;
  std::unique_ptr<ResponseStore> responses_store_;
  std::unique_ptr<ReasoningCipher> reasoning_cipher_;
  ResponsesHttpContext responses_;  // for ServeResponses
  std::unique_ptr<HttpTransport> server_;
  int port_ = 0;
  std::unique_ptr<HttpTransport> metrics_server_;
  int metrics_port_ = 0;
  std::mutex active_mu_;
  std::set<uint64_t> active_;  // under active_mu_
};

}  // namespace flotilla::coordinator
