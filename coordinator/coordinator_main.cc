// flotilla-coordinator: the control plane and front door of one model instance.
// Every flag also reads a FLOTILLA_* environment variable (same name, upper
// case, dashes as underscores), so pods and laptops start it the same way.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>

#include "absl/time/time.h"
#include "common/cluster_token.h"
#include "common/comm_names.h"
#include "common/command_line.h"
#include "common/config_file.h"
#include "common/listen_address.h"
#include "common/logging.h"
#include "common/model_spec.h"
#include "common/tls_credentials.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/access_log.h"
#include "coordinator/auth.h"
#include "coordinator/client_buffers.h"
#include "coordinator/cluster/cluster_manager.h"
#include "coordinator/cluster/drain.h"
#include "coordinator/grpc/reflection_v1.h"
#include "coordinator/grpc/services.h"
#include "coordinator/http/http_server.h"
#include "coordinator/input_limits.h"
#include "coordinator/served_models.h"
#include "spdlog/spdlog.h"

namespace {

// SIGINT/SIGTERM received: the first drains, a second stops at once.
std::atomic<int> g_signals{0};
void OnSignal(int) { g_signals.fetch_add(1); }

}  // namespace

namespace {

// The admin API alone on its own address (--admin-listen); its bound port
// goes to `port_file` when one is named.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartAdminServer(
    const flotilla::ListenAddress& address, const std::shared_ptr<grpc::ServerCredentials>& creds,
    grpc::Service* admin, const std::string& port_file) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address.ToString(), creds, &port);
  builder.RegisterService(admin);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("--admin-listen ", address.ToString(), ": cannot listen on it"));
  }
  spdlog::info("admin API on port {}", port);
  if (!port_file.empty()) {
    std::ofstream(port_file + ".tmp") << port << "\n";
    std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  }
  return server;
}

// A CLI11 check from one of common/comm_names.h's parsers, so a value that
// cannot work stops the coordinator at start, naming the flag, the value and
// the accepted values, before any worker joins.
template <typename Parse>
CLI::Validator NameCheck(Parse parse) {
  return CLI::Validator(
      [parse](std::string& value) -> std::string {
        auto parsed = parse(value);
        return parsed.ok() ? std::string() : std::string(parsed.status().message());
      },
      "");
}

// The scheduler's policy flags (worker/prefill_policy.h, worker/README.md
// "Scheduling policy"), vLLM's names where vLLM has the knob. Their defaults
// are the served policy: shortest prompt first, no prompt waiting over a
// second behind shorter ones.
void AddSchedulerPolicyFlags(CLI::App& app, flotilla::cluster::SchedulerPolicy* policy) {
  using flotilla::cluster::PrefillOrder;
  policy->set_prefill_order(flotilla::cluster::PREFILL_ORDER_SHORTEST_PROMPT_FIRST);
  policy->set_max_prefill_wait_ms(1000);
  const std::map<std::string, PrefillOrder> orders = {
      {"fcfs", flotilla::cluster::PREFILL_ORDER_FCFS},
      {"shortest-prompt-first", flotilla::cluster::PREFILL_ORDER_SHORTEST_PROMPT_FIRST}};
  app.add_option_function<std::string>(
         "--scheduling-policy",
         [policy, orders](const std::string& v) { policy->set_prefill_order(orders.at(v)); },
         "order of the prompts waiting for prefill: fcfs, or shortest-prompt-first (fewest "
         "prompt tokens left first, within --max-prefill-wait-ms)")
      ->default_str("shortest-prompt-first")
      ->check(CLI::IsMember({"fcfs", "shortest-prompt-first"}));
  app.add_option_function<uint32_t>(
         "--max-prefill-wait-ms", [policy](uint32_t ms) { policy->set_max_prefill_wait_ms(ms); },
         "shortest-prompt-first: a prompt waiting this long goes before every other (0 = no "
         "bound)")
      ->default_str("1000");
  app.add_option_function<uint32_t>(
         "--max-num-partial-prefills",
         [policy](uint32_t n) { policy->set_max_num_partial_prefills(n); },
         "prompts given a chunk in one step (0 = as many as the token budget takes)")
      ->default_str("0");
  app.add_option_function<uint32_t>(
         "--max-long-partial-prefills",
         [policy](uint32_t n) { policy->set_max_long_partial_prefills(n); },
         "of those, prompts longer than --long-prefill-token-threshold (0 = no bound)")
      ->default_str("0");
  app.add_option_function<uint32_t>(
         "--long-prefill-token-threshold",
         [policy](uint32_t n) { policy->set_long_prefill_token_threshold(n); },
         "a prompt longer than this is long: its chunk is at most this many tokens while other "
         "prompts want the budget (0 = no prompt is long)")
      ->default_str("0");
  app.add_option_function<uint32_t>(
         "--idle-prefill-tokens", [policy](uint32_t n) { policy->set_idle_prefill_tokens(n); },
         "a step with no decode token (nothing is generating yet) may prefill up to this many "
         "prompt tokens when that is more than --max-num-batched-tokens: a long prompt on an "
         "idle instance takes fewer, larger steps (workers size their buffers for the larger "
         "step; 0 = every step within --max-num-batched-tokens)")
      ->default_str("0");
  // Speculative decoding (worker/README.md "Speculative decoding"): the
  // default of requests that do not choose, sent to every worker.
  app.add_option_function<std::string>(
         "--speculative-method",
         [policy](const std::string& v) { policy->mutable_speculative()->set_method(v); },
         "speculative decoding for requests that do not choose: ngram (prompt lookup), suffix "
         "(suffix matching over the request and recent outputs), eagle3 (the "
         "--speculative-model head), replay (benchmarks only: needs --allow-replay-drafter) "
         "or off; verified exactly by the CPU and CUDA engines (default: the workers' own "
         "--speculative-method, off unless set)")
      ->check(CLI::IsMember({"ngram", "suffix", "eagle3", "replay", "off"}));
  app.add_option_function<std::string>(
      "--speculative-model", [policy](const std::string& v) { policy->set_speculative_model(v); },
      "EAGLE3 draft head every worker loads for --speculative-method eagle3 and requests "
      "choosing it: a directory in the published layout (config.json, safetensors; the "
      "workers read it) or synthetic:eagle3[:SEED] (default: the workers' own)");
  app.add_option_function<uint32_t>(
         "--num-speculative-tokens",
         [policy](uint32_t n) { policy->mutable_speculative()->set_num_speculative_tokens(n); },
         "tokens drafted per decode step with --speculative-method (default 3)")
      ->check(CLI::Range(1, 16));
  app.add_option_function<uint32_t>(
      "--speculative-max-batch", [policy](uint32_t n) { policy->set_speculative_max_batch(n); },
      "steps with more decoding sequences than this draft nothing (default: the workers' "
      "own --speculative-max-batch)");
  app.add_flag_callback(
      "--allow-replay-drafter", [policy] { policy->set_allow_replay_drafter(true); },
      "benchmarks only: requests may choose the replay drafter (the recorded output of an "
      "earlier identical request, with --replay-error-rate's errors)");
  app.add_option_function<double>(
         "--replay-error-rate",
         [policy](double e) { policy->mutable_speculative()->set_replay_error_rate(e); },
         "replay drafter: probability that each drafted token is wrong (sets the acceptance "
         "length; default: the workers' own, 0)")
      ->check(CLI::Range(0.0, 1.0));
}

}  // namespace

int main(int argc, char** argv) {
  flotilla::coordinator::ReturnLargeBuffersToSystem();
  CLI::App app{"flotilla-coordinator: places workers and serves the client API"};
  std::string listen = "127.0.0.1:50051";
  std::string model;
  std::string model_id;
  std::string port_file;
  int workers = 1, tp = 0, dp = 0;
  int hb_interval_ms = 250, hb_timeout_ms = 2000;
  flotilla::coordinator::ClusterOptions opts;
  app.add_option("--listen", listen, "address:port for workers, clients and admin (port 0 = any)")
      ->capture_default_str();
  app.add_option("--model", model,
                 "checkpoint directory (Hugging Face layout), or synthetic:PRESET[:SEED] "
                 "(tiny, 20b or 120b: make-checkpoint's weights, generated by the workers)")
      ->required();
  app.add_option("--model-id", model_id,
                 "model name clients use (default: the directory name, or the synthetic spec)");
  std::vector<std::string> served_model_names;
  app.add_option(
         "--served-model-name", served_model_names,
         "names requests may give as `model` (repeat it or separate with commas); the first "
         "replaces --model-id in replies, /v1/models and ListModels list each")
      ->delimiter(',');
  app.add_option("--workers", workers, "workers of the cluster (split evenly into --instances)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--instances", opts.instances,
                 "model instances the workers form (each placed, failed and drained on its own; "
                 "requests are routed among them)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  std::string router = "cache-aware";
  app.add_option("--router", router,
                 "how requests are spread over the instances: cache-aware (the longest cached "
                 "prompt prefix against the load), least-loaded or round-robin")
      ->capture_default_str()
      ->check(CLI::IsMember({"cache-aware", "least-loaded", "round-robin"}));
  std::string migrate = "auto";
  app.add_option("--migrate-requests", migrate,
                 "when an instance fails or is drained, continue its requests on another one "
                 "(or on the same one once it formed again) instead of failing them: on, off, or "
                 "auto (on with several instances)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  double migration_wait_s = 30;
  app.add_option("--migration-wait-s", migration_wait_s,
                 "how long a request whose instance failed waits for one to take it")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--tp", tp, "attention tensor-parallel size (0 = automatic)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dp", dp, "data-parallel attention groups (0 = automatic)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  std::string comm = "ucx", device_transport = "auto";
  app.add_option("--comm", comm,
                 "host communicator between workers (control, bootstrap, CPU tensors); accepted: "
                 "ucx")
      ->capture_default_str()
      ->check(NameCheck(flotilla::ParseCommBackend));
  app.add_option("--device-transport", device_transport,
                 "how GPU ranks move device buffers: auto (cuda-ipc when every rank is on one "
                 "node, else nccl), cuda-ipc or nccl; CPU ranks have none")
      ->capture_default_str()
      ->check(NameCheck(flotilla::ParseDeviceTransport));
  std::string moe_parallel = "auto";
  app.add_option("--moe-parallel", moe_parallel,
                 "how each instance splits its MoE layer: ep (whole experts spread over every "
                 "rank; tokens dispatched to them and combined back), tp (every rank of a TP "
                 "group holds a slice of every expert; one all-reduce, no dispatch) or auto (tp "
                 "for a GPU instance of one TP group, else ep)")
      ->capture_default_str()
      ->check(NameCheck(flotilla::ParseMoeLayout));
  app.add_option("--heartbeat-interval-ms", hb_interval_ms, "how often workers report")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--heartbeat-timeout-ms", hb_timeout_ms, "silence after which a worker is dead")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  double drain_timeout_s = 30;
  app.add_option("--drain-timeout", drain_timeout_s,
                 "on SIGTERM/SIGINT: seconds the requests in flight get to finish while new ones "
                 "are refused (HTTP 503, gRPC UNAVAILABLE); a second signal stops at once")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  int forget_dead_workers_s = 60;
  app.add_option("--forget-dead-workers-s", forget_dead_workers_s,
                 "a dead worker without a rank leaves the registry after this many seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-inflight", opts.max_inflight_requests,
                 "requests in flight before RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-num-batched-tokens,--max-batch-tokens", opts.max_batch_tokens,
                 "token budget of one step: a decode token per running sequence, then prompt "
                 "chunks by the scheduling policy")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  AddSchedulerPolicyFlags(app, &opts.scheduler_policy);
  app.add_option("--max-sequences", opts.max_sequences, "sequences running per DP group")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-model-len", opts.max_model_len,
                 "longest sequence (prompt + output) served; 0 = the model's context")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  uint64_t max_prompt_logits_mb = opts.max_prompt_logits_bytes >> 20;
  app.add_option("--max-prompt-logits-mb", max_prompt_logits_mb,
                 "largest return_prompt_logits answer (prompt tokens x vocab x 4 bytes) served; "
                 "larger requests are refused with INVALID_ARGUMENT")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--kv-blocks", opts.kv_blocks, "KV blocks per worker (0 = sized automatically)")
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", opts.kv_cache_dtype,
                 "full-attention layers' KV cache on every worker: bf16, fp8 (e4m3 with a scale "
                 "per position and head; sliding-window layers stay bf16) or auto (each "
                 "worker's own --kv-cache-dtype, bf16 by default)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}));
  app.add_option("--moe-activation", opts.moe_activation,
                 "the experts' inputs on every worker: bf16 (the engine's own precision), fp8 "
                 "(MXFP8 blocks of 32 values, the numerics of a W4A8 MoE; CPU engine only) or "
                 "auto (each worker's own --moe-activation, bf16 by default)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}));
  double expert_window_s = 10, rebalance_interval_s = 0;
  app.add_option("--redundant-experts", opts.redundant_experts,
                 "spare expert slots per layer on every rank, for replicas of hot experts")
      ->capture_default_str();
  app.add_option("--expert-window", expert_window_s,
                 "seconds of expert load the balancer and `flotillactl experts` look at")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 60.0));
  app.add_option("--rebalance-interval", rebalance_interval_s,
                 "seconds between automatic rebalances (0 = off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rebalance-min-imbalance", opts.rebalance_min_imbalance,
                 "automatic rebalancing acts only above this imbalance (max / mean rank load)")
      ->capture_default_str();
  app.add_option("--rebalance-max-bytes", opts.rebalance_max_bytes,
                 "expert bytes one rebalance may load (0 = no bound)")
      ->capture_default_str();
  std::string tokenizer_path = flotilla::tokenizer::Tokenizer::DefaultRanksPath();
  app.add_option("--tokenizer", tokenizer_path, "o200k_harmony ranks file")->capture_default_str();
  app.add_option("--port-file", port_file, "write the bound port here once listening");
  std::string http_listen = "127.0.0.1:8000";
  std::string http_port_file;
  app.add_option("--http-listen", http_listen,
                 "host:port of the OpenAI-compatible HTTP API (port 0 = any; empty = off)")
      ->capture_default_str();
  app.add_option("--http-port-file", http_port_file,
                 "write the bound HTTP port here once listening");
  bool grpc_reflection = true;
  app.add_option("--grpc-reflection", grpc_reflection,
                 "serve gRPC server reflection (grpc.reflection.v1 and v1alpha) so that grpcurl, "
                 "grpcui and "
                 "Postman find the services without the .proto files; it answers without a key, "
                 "like health, and tells only the API's schema")
      ->capture_default_str();
  std::string api_key_file, admin_key_file, metrics_listen, metrics_port_file;
  app.add_option("--api-key-file", api_key_file,
                 "client API keys, one a line ('#' comments); without it (and without "
                 "--admin-key-file) anyone who reaches the ports may call everything");
  app.add_option("--admin-key-file", admin_key_file,
                 "admin keys (same format): SetExpertMap and MeasureEngine need one; with "
                 "--api-key-file alone those calls are refused");
  app.add_option("--metrics-listen", metrics_listen,
                 "host:port of a listener serving only GET /metrics, without a key (port 0 = "
                 "any; empty = none: /metrics is on the HTTP API, behind the admin key when keys "
                 "are set)");
  flotilla::coordinator::CacheDomainPolicy cache_domains;
  app.add_flag("--shared-prefix-cache", cache_domains.shared,
               "let requests of different API keys share cached prompt blocks (by default each "
               "key, and each request cache_salt, has a prefix-cache domain of its own: a cache "
               "hit's faster first token would tell one tenant what another asked)");
  bool access_log_ids = false;
  app.add_flag("--access-log-ids", access_log_ids,
               "write request ids into the access log (off: a stored response's id continues its "
               "conversation, so ids stay out of logs unless asked for)");
  bool metrics_for_clients = false;
  app.add_flag("--metrics-for-clients", metrics_for_clients,
               "let client keys read /metrics on the HTTP API too (its counters, prefix-cache hits "
               "among them, tell about every tenant's requests); default: the admin key only");
  std::vector<std::string> allowed_origins;
  app.add_option("--allowed-origins", allowed_origins,
                 "origins browsers may call the HTTP API from (CORS), comma-separated, e.g. "
                 "https://app.example.com, or * for any; default: none (no CORS headers)")
      ->delimiter(',')
      ->check([](const std::string& origin) {
        absl::StatusOr<flotilla::coordinator::CorsPolicy> policy =
            flotilla::coordinator::CorsPolicy::Create({origin});
        return policy.ok() ? std::string() : std::string(policy.status().message());
      });
  app.add_option("--metrics-port-file", metrics_port_file,
                 "write the bound --metrics-listen port here once listening");
  std::string cluster_token_file;
  app.add_option("--cluster-token-file", cluster_token_file,
                 "file holding the cluster token workers must present (first line); "
                 "without it any process that reaches --listen can join as a worker");
  size_t max_request_bytes = flotilla::coordinator::kDefaultMaxRequestBytes;
  app.add_option("--max-request-bytes", max_request_bytes,
                 "largest HTTP body and gRPC client message; larger ones are refused unread "
                 "(HTTP 413, RESOURCE_EXHAUSTED)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  std::string admin_listen, admin_port_file;
  app.add_option("--admin-listen", admin_listen,
                 "host:port of a listener of its own for the admin API (flotilla.admin.Admin), "
                 "e.g. one only operators reach; empty = the admin API is on --listen");
  app.add_option("--admin-port-file", admin_port_file,
                 "write the bound --admin-listen port here once listening");
  flotilla::TlsServerFiles tls;
  app.add_option("--tls-cert", tls.cert,
                 "PEM certificate chain: serve gRPC and HTTP over TLS (with --tls-key)");
  app.add_option("--tls-key", tls.key, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", tls.client_ca,
                 "PEM CA: gRPC and HTTPS clients and workers need a certificate it signed (mTLS)");
  flotilla::coordinator::HttpServerOptions http_options;
  app.add_option("--http-max-connections", http_options.connections.max_connections,
                 "open HTTP connections at most; past it a new one gets 503 and is closed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  double header_timeout_s = 10, body_timeout_s = 60, idle_timeout_s = 60;
  app.add_option("--http-header-timeout-s", header_timeout_s,
                 "seconds a request's head may take from its first byte (else 408 and close)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--http-body-timeout-s", body_timeout_s,
                 "seconds a request's body may take after its head (else 408 and close)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--http-idle-timeout-s", idle_timeout_s,
                 "seconds a kept-alive HTTP connection may wait for its next request")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  double responses_ttl_s = 3600;
  app.add_option("--responses-store-max-entries", http_options.responses_store.max_entries,
                 "/v1/responses kept for previous_response_id at most (the oldest go first)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--responses-store-ttl-s", responses_ttl_s,
                 "seconds a stored /v1/responses answer stays usable as previous_response_id")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--responses-store-max-bytes", http_options.responses_store.max_bytes,
                 "bytes of stored /v1/responses conversations at most (the oldest go first)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option(
      "--reasoning-key-file", http_options.reasoning_key_file,
      "keys of /v1/responses' reasoning encrypted_content: one a line, 64 hex digits, the "
      "current first, then older ones still accepted (default: a random key per process)");
  // The request field policy (coordinator/http/request_fields.h).
  bool strict_request_fields = false;
  app.add_flag("--strict-request-fields", strict_request_fields,
               "refuse request fields this server does not know with a 400 naming them (default: "
               "ignore them, naming them in the x-flotilla-ignored-fields header and the log)");
  std::string reasoning_field = "both";
  app.add_option("--reasoning-field", reasoning_field,
                 "the chat message and delta member carrying reasoning text: reasoning (vLLM's "
                 "current name), reasoning_content (its older one) or both")
      ->capture_default_str()
      ->check(CLI::IsMember({"reasoning", "reasoning_content", "both"}));
  // Flow control toward clients (coordinator/client_buffers.h).
  flotilla::coordinator::ClientBufferOptions client_buffers;
  double client_stall_timeout_s = 10;
  app.add_option("--max-stream-buffer-bytes", client_buffers.max_stream_bytes,
                 "bytes one gRPC stream or HTTP response may queue for a client that does not "
                 "read; over it for --client-stall-timeout-s the "
                 "request is cancelled and the stream ended (RESOURCE_EXHAUSTED)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-client-buffer-bytes", client_buffers.max_total_bytes,
                 "bytes queued for all clients together; over it the streams holding the most "
                 "are ended at once (RESOURCE_EXHAUSTED)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--client-stall-timeout-s", client_stall_timeout_s,
                 "seconds a stream may stay over --max-stream-buffer-bytes before it is ended")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  flotilla::LogOptions log_options;
  flotilla::AddLogFlags(app, &log_options);
  flotilla::NameEnvironmentVariables(app);
  flotilla::AddVersionFlag(app, "flotilla-coordinator");
  flotilla::AddConfigFlag(app);
  if (std::optional<int> exit_code = flotilla::ParseCommandLine(app, argc, argv)) return *exit_code;
  if (opts.scheduler_policy.speculative().method() == "replay" &&
      !opts.scheduler_policy.allow_replay_drafter()) {
    std::cerr << "flotilla-coordinator: --speculative-method replay drafts recorded outputs and "
                 "is for benchmarks only; add --allow-replay-drafter\n";
    return 2;
  }
  if (opts.scheduler_policy.speculative().method() == "eagle3" &&
      opts.scheduler_policy.speculative_model().empty()) {
    std::cerr << "flotilla-coordinator: --speculative-method eagle3 needs --speculative-model DIR "
                 "(or synthetic:eagle3)\n";
    return 2;
  }
  flotilla::coordinator::SetAccessLogIds(access_log_ids);
  if (absl::Status st = flotilla::ConfigureLogging(log_options); !st.ok()) {
    std::cerr << "flotilla-coordinator: " << st.message() << "\n";
    return 2;
  }

  // Addresses, ports and TLS files are checked before anything starts: a taken
  // port or a bad file is a clear error and exit 1 within milliseconds.
  absl::StatusOr<flotilla::ListenAddress> grpc_address =
      flotilla::ParseListenAddress(listen, "--listen");
  absl::StatusOr<flotilla::ListenAddress> http_address =
      http_listen.empty() ? flotilla::ListenAddress()
                          : flotilla::ParseListenAddress(http_listen, "--http-listen");
  absl::Status startup = grpc_address.status();
  if (startup.ok()) startup = http_address.status();
  if (startup.ok()) startup = flotilla::CheckPortFree(*grpc_address, "--listen");
  if (startup.ok() && !http_listen.empty()) {
    startup = flotilla::CheckPortFree(*http_address, "--http-listen");
  }
  absl::StatusOr<flotilla::ListenAddress> admin_address =
      admin_listen.empty() ? flotilla::ListenAddress()
                           : flotilla::ParseListenAddress(admin_listen, "--admin-listen");
  if (startup.ok()) startup = admin_address.status();
  if (startup.ok() && !admin_listen.empty()) {
    startup = flotilla::CheckPortFree(*admin_address, "--admin-listen");
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      flotilla::MakeServerCredentials(tls);
  if (startup.ok()) startup = credentials.status();
  if (!startup.ok()) {
    std::cerr << "flotilla-coordinator: " << startup.message() << "\n";
    return 1;
  }

  absl::StatusOr<flotilla::ModelConfig> config = flotilla::LoadModelConfig(model);
  if (!config.ok()) {
    std::cerr << "flotilla-coordinator: " << config.status().message() << "\n";
    return 2;
  }
  opts.expected_workers = workers;
  opts.router = *flotilla::coordinator::ParseRouterPolicy(router);  // checked by IsMember
  opts.migrate_requests = migrate == "on" || (migrate == "auto" && opts.instances > 1);
  opts.migration_wait = absl::Seconds(migration_wait_s);
  // Checked by NameCheck at parse time.
  opts.comm_backend = *flotilla::ParseCommBackend(comm);
  opts.layout = {tp, dp, *flotilla::ParseDeviceTransport(device_transport),
                 *flotilla::ParseMoeLayout(moe_parallel)};
  opts.model_path = model;
  opts.model = *config;
  opts.heartbeat_interval = absl::Milliseconds(hb_interval_ms);
  opts.heartbeat_timeout = absl::Milliseconds(hb_timeout_ms);
  opts.forget_dead_workers_after = absl::Seconds(forget_dead_workers_s);
  opts.max_prompt_logits_bytes = max_prompt_logits_mb << 20;
  opts.expert_window = absl::Seconds(expert_window_s);
  opts.rebalance_interval = absl::Seconds(rebalance_interval_s);
  auto manager = flotilla::coordinator::ClusterManager::Create(opts);
  if (!manager.ok()) {
    std::cerr << "flotilla-coordinator: " << manager.status().message() << "\n";
    return 2;
  }
  if (model_id.empty()) model_id = flotilla::DefaultModelId(model);
  auto served_names = flotilla::coordinator::ServedModelNames(served_model_names, model_id);
  if (!served_names.ok()) {
    std::cerr << "flotilla-coordinator: " << served_names.status().message() << "\n";
    return 2;
  }
  model_id = served_names->front();
  auto auth = flotilla::coordinator::Authenticator::Create(api_key_file, admin_key_file);
  if (!auth.ok()) {
    std::cerr << "flotilla-coordinator: " << auth.status().message() << "\n";
    return 2;
  }
  if (!metrics_listen.empty() && http_listen.empty()) {
    std::cerr << "flotilla-coordinator: --metrics-listen needs the HTTP API (--http-listen)\n";
    return 2;
  }
  if ((*auth)->open()) {
    spdlog::warn(
        "no --api-key-file or --admin-key-file: the client and admin APIs are open to "
        "anyone who can reach {}",
        listen);
  } else if (!(*auth)->has_admin_keys()) {
    spdlog::info("no --admin-key-file: SetExpertMap and MeasureEngine are refused");
  }

  std::optional<std::string> cluster_token;
  if (!cluster_token_file.empty()) {
    absl::StatusOr<std::string> token = flotilla::ReadClusterTokenFile(cluster_token_file);
    if (!token.ok()) {
      std::cerr << "flotilla-coordinator: --cluster-token-file: " << token.status().message()
                << "\n";
      return 2;
    }
    cluster_token = *std::move(token);
  } else {
    spdlog::warn("no --cluster-token-file: any process that can reach {} can join as a worker, "
                 "take a rank and see and answer requests",
                 listen);
  }
  flotilla::coordinator::ClusterControlService control(manager->get(), std::move(cluster_token));
  flotilla::coordinator::AdminService admin(manager->get(), auth->get());
  auto tokenizer = flotilla::tokenizer::Tokenizer::Create(tokenizer_path);
  if (!tokenizer.ok()) {
    std::cerr << "flotilla-coordinator: --tokenizer " << tokenizer_path << ": "
              << tokenizer.status().message() << "\n";
    return 2;
  }
  flotilla::coordinator::FrontendService frontend(manager->get(), model_id, tokenizer->get(),
                                                  flotilla::harmony::OpenAiRequestOptions(),
                                                  auth->get());
  flotilla::coordinator::InputLimits limits;
  limits.max_request_bytes = max_request_bytes;
  limits.max_prompt_text_bytes =
      flotilla::coordinator::PromptTextByteLimit(config->max_position_embeddings, **tokenizer);
  frontend.SetInputLimits(limits);
  frontend.SetCacheDomains(cache_domains);
  frontend.SetServedModelNames(*served_names);
  client_buffers.stall_grace = absl::Seconds(client_stall_timeout_s);
  client_buffers.max_open_requests = opts.max_inflight_requests;
  std::shared_ptr<flotilla::coordinator::ClientBuffers> buffers =
      flotilla::coordinator::ClientBuffers::Create(client_buffers);
  frontend.SetClientBuffers(buffers);
  grpc::EnableDefaultHealthCheckService(true);
  // v1alpha: Debian's plugin, registered with every ServerBuilder made from
  // here on. v1: ours, answering from the same descriptors with the same list.
  std::unique_ptr<flotilla::coordinator::ReflectionV1Service> reflection_v1;
  if (grpc_reflection) {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    std::vector<std::string> services = {
        flotilla::cluster::ClusterControl::service_full_name(),
        flotilla::v1::Flotilla::service_full_name(), "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        grpc::reflection::v1::ServerReflection::service_full_name()};
    if (admin_listen.empty()) services.push_back(flotilla::admin::Admin::service_full_name());
    reflection_v1 =
        std::make_unique<flotilla::coordinator::ReflectionV1Service>(std::move(services));
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(grpc_address->ToString(), *credentials, &port);
  builder.RegisterService(&control);
  if (admin_listen.empty()) builder.RegisterService(&admin);
  builder.RegisterService(&frontend);
  if (reflection_v1) builder.RegisterService(reflection_v1.get());
  // The transport refuses anything over the larger of the client limit and the
  // workers' session messages; the frontend holds client calls to theirs.
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<size_t>(
      std::max(max_request_bytes, flotilla::coordinator::kWorkerSessionMessageBytes), INT32_MAX)));
  builder.SetMaxSendMessageSize(256 << 20);
  // A second server on a taken port must fail, not share it (gRPC sets
  // SO_REUSEPORT by default).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "flotilla-coordinator: --listen " << listen << ": cannot listen on port "
              << grpc_address->port << "\n";
    return 1;
  }
  std::unique_ptr<grpc::Server> admin_server;
  if (!admin_listen.empty()) {
    absl::StatusOr<std::unique_ptr<grpc::Server>> started =
        StartAdminServer(*admin_address, *credentials, &admin, admin_port_file);
    if (!started.ok()) {
      std::cerr << "flotilla-coordinator: " << started.status().message() << "\n";
      server->Shutdown();
      return 1;
    }
    admin_server = *std::move(started);
  }
  std::unique_ptr<flotilla::coordinator::HttpServer> http;
  if (!http_listen.empty()) {
    http_options.connections.header_timeout = absl::Seconds(header_timeout_s);
    http_options.connections.body_timeout = absl::Seconds(body_timeout_s);
    http_options.connections.idle_timeout = absl::Seconds(idle_timeout_s);
    http_options.responses_store.max_age = absl::Seconds(responses_ttl_s);
    http_options.listen = http_listen;
    http_options.model_id = model_id;
    http_options.served_model_names = *served_names;
    if (!(*auth)->open()) http_options.auth = auth->get();
    http_options.metrics_listen = metrics_listen;
    http_options.metrics_for_clients = metrics_for_clients;
    http_options.cors = *flotilla::coordinator::CorsPolicy::Create(allowed_origins);
    http_options.limits = limits;
    http_options.cache_domains = cache_domains;
    http_options.unknown_fields = strict_request_fields
                                      ? flotilla::coordinator::UnknownFields::kRefuse
                                      : flotilla::coordinator::UnknownFields::kIgnore;
    http_options.reasoning_field = *flotilla::coordinator::ParseReasoningField(reasoning_field);
    http_options.client_buffers = buffers;
    http_options.tls = tls;
    auto created = flotilla::coordinator::HttpServer::Create(http_options, manager->get(), tokenizer->get());
    if (!created.ok()) {
      std::cerr << "flotilla-coordinator: " << created.status().message() << "\n";
      server->Shutdown();
      return 1;
    }
    http = *std::move(created);
    spdlog::info("OpenAI-compatible HTTP API on {}:{}", http_listen.substr(0, http_listen.rfind(':')),
                 http->port());
    if (!http_port_file.empty()) {
      std::ofstream(http_port_file + ".tmp") << http->port() << "\n";
      std::rename((http_port_file + ".tmp").c_str(), http_port_file.c_str());
    }
    if (http->metrics_port() > 0) {
      spdlog::info("/metrics (no key) on {}:{}",
                   metrics_listen.substr(0, metrics_listen.rfind(':')), http->metrics_port());
      if (!metrics_port_file.empty()) {
        std::ofstream(metrics_port_file + ".tmp") << http->metrics_port() << "\n";
        std::rename((metrics_port_file + ".tmp").c_str(), metrics_port_file.c_str());
      }
    }
  }
  std::string host = listen.substr(0, listen.rfind(':'));
  spdlog::info("coordinator listening on {}:{} for {} workers (model {})", host, port, workers,
               model_id);
  if (!port_file.empty()) {
    std::ofstream(port_file + ".tmp") << port << "\n";
    std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  // gRPC health follows the instance: SERVING only while it can take requests
  // (the overall "" service stays SERVING while the process is up, for liveness).
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  bool serving = false;
  health->SetServingStatus("flotilla.v1.Flotilla", false);
  while (g_signals.load() == 0) {
    const bool ready = (*manager)->Status().state() == flotilla::admin::READY;
    if (ready != serving) {
      health->SetServingStatus("flotilla.v1.Flotilla", ready);
      serving = ready;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  health->SetServingStatus("flotilla.v1.Flotilla", false);
  spdlog::info("coordinator stopping: draining for up to {} s (a second signal stops at once)",
               drain_timeout_s);
  const flotilla::coordinator::DrainResult drained = flotilla::coordinator::Drain(
      **manager, absl::Seconds(drain_timeout_s), [] { return g_signals.load() > 1; });
  spdlog::info("{}", flotilla::coordinator::DescribeDrain(drained));
  // Streams that just ended still write their last messages (after a second
  // signal, the status that says so): give them a moment, a short one when told
  // to stop at once. Both stops return as soon as no call is left.
  const absl::Duration grace_period = drained.interrupted ? absl::Seconds(1) : absl::Seconds(2);
  const auto grace = absl::ToChronoTime(absl::Now() + grace_period);
  if (http) http->Stop(grace_period);
  if (admin_server) admin_server->Shutdown(grace);
  server->Shutdown(grace);
  spdlog::info("coordinator stopped");
  return 0;
}
