#include "coordinator/coordinator_flags.h"

#include <CLI/CLI.hpp>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/comm_names.h"
#include "coordinator/http/cors.h"

namespace flotilla::coordinator {
namespace {

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
void AddSchedulerPolicyFlags(CLI::App& app, cluster::SchedulerPolicy* policy) {
  using cluster::PrefillOrder;
  policy->set_prefill_order(cluster::PREFILL_ORDER_SHORTEST_PROMPT_FIRST);
  policy->set_max_prefill_wait_ms(1000);
  const std::map<std::string, PrefillOrder> orders = {
      {"fcfs", cluster::PREFILL_ORDER_FCFS},
      {"shortest-prompt-first", cluster::PREFILL_ORDER_SHORTEST_PROMPT_FIRST}};
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
}

// Speculative decoding (worker/README.md "Speculative decoding"): the
// default of requests that do not choose, sent to every worker.
void AddSpeculativeFlags(CLI::App& app, cluster::SchedulerPolicy* policy) {
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

// The model, where workers and clients reach the coordinator, and how its
// workers form instances that requests are routed among.
void AddClusterFlags(CLI::App& app, CoordinatorFlags* flags) {
  app.add_option("--listen", flags->listen,
                 "address:port for workers, clients and admin (port 0 = any)")
      ->capture_default_str();
  app.add_option("--model", flags->model,
                 "checkpoint directory (Hugging Face layout), or synthetic:PRESET[:SEED] "
                 "(tiny, 20b or 120b: make-checkpoint's weights, generated by the workers)")
      ->required();
  app.add_option("--model-id", flags->model_id,
                 "model name clients use (default: the directory name, or the synthetic spec)");
  app.add_option(
         "--served-model-name", flags->served_model_names,
         "names requests may give as `model` (repeat it or separate with commas); the first "
         "replaces --model-id in replies, /v1/models and ListModels list each")
      ->delimiter(',');
  app.add_option("--workers", flags->workers,
                 "workers of the cluster (split evenly into --instances)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--instances", flags->opts.instances,
                 "model instances the workers form (each placed, failed and drained on its own; "
                 "requests are routed among them)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--router", flags->router,
                 "how requests are spread over the instances: cache-aware (the longest cached "
                 "prompt prefix against the load), least-loaded or round-robin")
      ->capture_default_str()
      ->check(CLI::IsMember({"cache-aware", "least-loaded", "round-robin"}));
  app.add_option("--migrate-requests", flags->migrate,
                 "when an instance fails or is drained, continue its requests on another one "
                 "(or on the same one once it formed again) instead of failing them: on, off, or "
                 "auto (on with several instances)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--migration-wait-s", flags->migration_wait_s,
                 "how long a request whose instance failed waits for one to take it")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

// How each instance lays out its ranks and moves data between them, and how
// long workers and requests in flight are waited for.
void AddPlacementFlags(CLI::App& app, CoordinatorFlags* flags) {
  app.add_option("--tp", flags->tp, "attention tensor-parallel size (0 = automatic)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dp", flags->dp, "data-parallel attention groups (0 = automatic)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--comm", flags->comm,
                 "host communicator between workers (control, bootstrap, CPU tensors); accepted: "
                 "ucx")
      ->capture_default_str()
      ->check(NameCheck(ParseCommBackend));
  app.add_option("--device-transport", flags->device_transport,
                 "how GPU ranks move device buffers: auto (cuda-ipc when every rank is on one "
                 "node, else nccl), cuda-ipc or nccl; CPU ranks have none")
      ->capture_default_str()
      ->check(NameCheck(ParseDeviceTransport));
  app.add_option("--moe-parallel", flags->moe_parallel,
                 "how each instance splits its MoE layer: ep (whole experts spread over every "
                 "rank; tokens dispatched to them and combined back), tp (every rank of a TP "
                 "group holds a slice of every expert; one all-reduce, no dispatch) or auto (tp "
                 "for a GPU instance of one TP group, else ep)")
      ->capture_default_str()
      ->check(NameCheck(ParseMoeLayout));
  app.add_option("--heartbeat-interval-ms", flags->hb_interval_ms, "how often workers report")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--heartbeat-timeout-ms", flags->hb_timeout_ms,
                 "silence after which a worker is dead")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--drain-timeout", flags->drain_timeout_s,
                 "on SIGTERM/SIGINT: seconds the requests in flight get to finish while new ones "
                 "are refused (HTTP 503, gRPC UNAVAILABLE); a second signal stops at once")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--forget-dead-workers-s", flags->forget_dead_workers_s,
                 "a dead worker without a rank leaves the registry after this many seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

// What one instance takes on: requests in flight, each step's batch, the
// scheduler's policy, sequence lengths and the KV cache.
void AddSchedulingFlags(CLI::App& app, CoordinatorFlags* flags) {
  app.add_option("--max-inflight", flags->opts.max_inflight_requests,
                 "requests in flight before RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-num-batched-tokens,--max-batch-tokens", flags->opts.max_batch_tokens,
                 "token budget of one step: a decode token per running sequence, then prompt "
                 "chunks by the scheduling policy")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  AddSchedulerPolicyFlags(app, &flags->opts.scheduler_policy);
  AddSpeculativeFlags(app, &flags->opts.scheduler_policy);
  app.add_option("--max-sequences", flags->opts.max_sequences, "sequences running per DP group")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-model-len", flags->opts.max_model_len,
                 "longest sequence (prompt + output) served; 0 = the model's context")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-prompt-logits-mb", flags->max_prompt_logits_mb,
                 "largest return_prompt_logits answer (prompt tokens x vocab x 4 bytes) served; "
                 "larger requests are refused with INVALID_ARGUMENT")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--kv-blocks", flags->opts.kv_blocks,
                 "KV blocks per worker (0 = sized automatically)")
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", flags->opts.kv_cache_dtype,
                 "full-attention layers' KV cache on every worker: bf16, fp8 (e4m3 with a scale "
                 "per position and head; sliding-window layers stay bf16) or auto (each "
                 "worker's own --kv-cache-dtype, bf16 by default)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}));
  app.add_option("--moe-activation", flags->opts.moe_activation,
                 "the experts' inputs on every worker: bf16 (the engine's own precision), fp8 "
                 "(MXFP8 blocks of 32 values, the numerics of a W4A8 MoE; CPU engine only) or "
                 "auto (each worker's own --moe-activation, bf16 by default)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}));
}

// Expert balancing: spare slots, the load window and automatic rebalancing.
void AddExpertFlags(CLI::App& app, CoordinatorFlags* flags) {
  app.add_option("--redundant-experts", flags->opts.redundant_experts,
                 "spare expert slots per layer on every rank, for replicas of hot experts")
      ->capture_default_str();
  app.add_option("--expert-window", flags->expert_window_s,
                 "seconds of expert load the balancer and `flotillactl experts` look at")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 60.0));
  app.add_option("--rebalance-interval", flags->rebalance_interval_s,
                 "seconds between automatic rebalances (0 = off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rebalance-min-imbalance", flags->opts.rebalance_min_imbalance,
                 "automatic rebalancing acts only above this imbalance (max / mean rank load)")
      ->capture_default_str();
  app.add_option("--rebalance-max-bytes", flags->opts.rebalance_max_bytes,
                 "expert bytes one rebalance may load (0 = no bound)")
      ->capture_default_str();
}

// The tokenizer, the gRPC and HTTP listeners' port files and reflection.
void AddListenerFlags(CLI::App& app, CoordinatorFlags* flags) {
  app.add_option("--tokenizer", flags->tokenizer_path, "o200k_harmony ranks file")
      ->capture_default_str();
  app.add_option("--port-file", flags->port_file, "write the bound port here once listening");
  app.add_option("--http-listen", flags->http_listen,
                 "host:port of the OpenAI-compatible HTTP API (port 0 = any; empty = off)")
      ->capture_default_str();
  app.add_option("--http-port-file", flags->http_port_file,
                 "write the bound HTTP port here once listening");
  app.add_option("--grpc-reflection", flags->grpc_reflection,
                 "serve gRPC server reflection (grpc.reflection.v1 and v1alpha) so that grpcurl, "
                 "grpcui and "
                 "Postman find the services without the .proto files; it answers without a key, "
                 "like health, and tells only the API's schema")
      ->capture_default_str();
}

// Who may call what: keys, tenants' prefix-cache domains, /metrics, CORS,
// the cluster token and the largest request.
void AddAccessFlags(CLI::App& app, CoordinatorFlags* flags) {
  app.add_option("--api-key-file", flags->api_key_file,
                 "client API keys, one a line ('#' comments); without it (and without "
                 "--admin-key-file) anyone who reaches the ports may call everything");
  app.add_option("--admin-key-file", flags->admin_key_file,
                 "admin keys (same format): SetExpertMap and MeasureEngine need one; with "
                 "--api-key-file alone those calls are refused");
  app.add_option("--metrics-listen", flags->metrics_listen,
                 "host:port of a listener serving only GET /metrics, without a key (port 0 = "
                 "any; empty = none: /metrics is on the HTTP API, behind the admin key when keys "
                 "are set)");
  app.add_flag("--shared-prefix-cache", flags->cache_domains.shared,
               "let requests of different API keys share cached prompt blocks (by default each "
               "key, and each request cache_salt, has a prefix-cache domain of its own: a cache "
               "hit's faster first token would tell one tenant what another asked)");
  app.add_flag("--access-log-ids", flags->access_log_ids,
               "write request ids into the access log (off: a stored response's id continues its "
               "conversation, so ids stay out of logs unless asked for)");
  app.add_flag("--metrics-for-clients", flags->metrics_for_clients,
               "let client keys read /metrics on the HTTP API too (its counters, prefix-cache hits "
               "among them, tell about every tenant's requests); default: the admin key only");
  app.add_option("--allowed-origins", flags->allowed_origins,
                 "origins browsers may call the HTTP API from (CORS), comma-separated, e.g. "
                 "https://app.example.com, or * for any; default: none (no CORS headers)")
      ->delimiter(',')
      ->check([](const std::string& origin) {
        absl::StatusOr<CorsPolicy> policy = CorsPolicy::Create({origin});
        return policy.ok() ? std::string() : std::string(policy.status().message());
      });
  app.add_option("--metrics-port-file", flags->metrics_port_file,
                 "write the bound --metrics-listen port here once listening");
  app.add_option("--cluster-token-file", flags->cluster_token_file,
                 "file holding the cluster token workers must present (first line); "
                 "without it any process that reaches --listen can join as a worker");
  app.add_option("--max-request-bytes", flags->max_request_bytes,
                 "largest HTTP body and gRPC client message; larger ones are refused unread "
                 "(HTTP 413, RESOURCE_EXHAUSTED)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

// The admin API's own listener, and TLS on every listener.
void AddAdminAndTlsFlags(CLI::App& app, CoordinatorFlags* flags) {
  app.add_option("--admin-listen", flags->admin_listen,
                 "host:port of a listener of its own for the admin API (flotilla.admin.Admin), "
                 "e.g. one only operators reach; empty = the admin API is on --listen");
  app.add_option("--admin-port-file", flags->admin_port_file,
                 "write the bound --admin-listen port here once listening");
  app.add_option("--tls-cert", flags->tls.cert,
                 "PEM certificate chain: serve gRPC and HTTP over TLS (with --tls-key)");
  app.add_option("--tls-key", flags->tls.key, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", flags->tls.client_ca,
                 "PEM CA: gRPC and HTTPS clients and workers need a certificate it signed (mTLS)");
}

// The HTTP front end: connections and their timeouts, the /v1/responses
// store, and request and reply fields.
void AddHttpFlags(CLI::App& app, CoordinatorFlags* flags) {
  app.add_option("--http-max-connections", flags->http_options.connections.max_connections,
                 "open HTTP connections at most; past it a new one gets 503 and is closed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--http-header-timeout-s", flags->header_timeout_s,
                 "seconds a request's head may take from its first byte (else 408 and close)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--http-body-timeout-s", flags->body_timeout_s,
                 "seconds a request's body may take after its head (else 408 and close)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--http-idle-timeout-s", flags->idle_timeout_s,
                 "seconds a kept-alive HTTP connection may wait for its next request")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--responses-store-max-entries", flags->http_options.responses_store.max_entries,
                 "/v1/responses kept for previous_response_id at most (the oldest go first)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--responses-store-ttl-s", flags->responses_ttl_s,
                 "seconds a stored /v1/responses answer stays usable as previous_response_id")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--responses-store-max-bytes", flags->http_options.responses_store.max_bytes,
                 "bytes of stored /v1/responses conversations at most (the oldest go first)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option(
      "--reasoning-key-file", flags->http_options.reasoning_key_file,
      "keys of /v1/responses' reasoning encrypted_content: one a line, 64 hex digits, the "
      "current first, then older ones still accepted (default: a random key per process)");
  // The request field policy (coordinator/http/request_fields.h).
  app.add_flag("--strict-request-fields", flags->strict_request_fields,
               "refuse request fields this server does not know with a 400 naming them (default: "
               "ignore them, naming them in the x-flotilla-ignored-fields header and the log)");
  app.add_option("--reasoning-field", flags->reasoning_field,
                 "the chat message and delta member carrying reasoning text: reasoning (vLLM's "
                 "current name), reasoning_content (its older one) or both")
      ->capture_default_str()
      ->check(CLI::IsMember({"reasoning", "reasoning_content", "both"}));
}

// Flow control toward clients (coordinator/client_buffers.h).
void AddClientFlowControlFlags(CLI::App& app, CoordinatorFlags* flags) {
  app.add_option("--max-stream-buffer-bytes", flags->client_buffers.max_stream_bytes,
                 "bytes one gRPC stream or HTTP response may queue for a client that does not "
                 "read; over it for --client-stall-timeout-s the "
                 "request is cancelled and the stream ended (RESOURCE_EXHAUSTED)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-client-buffer-bytes", flags->client_buffers.max_total_bytes,
                 "bytes queued for all clients together; over it the streams holding the most "
                 "are ended at once (RESOURCE_EXHAUSTED)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--client-stall-timeout-s", flags->client_stall_timeout_s,
                 "seconds a stream may stay over --max-stream-buffer-bytes before it is ended")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

}  // namespace

void AddCoordinatorFlags(CLI::App& app, CoordinatorFlags* flags) {
  AddClusterFlags(app, flags);
  AddPlacementFlags(app, flags);
  AddSchedulingFlags(app, flags);
  AddExpertFlags(app, flags);
  AddListenerFlags(app, flags);
  AddAccessFlags(app, flags);
  AddAdminAndTlsFlags(app, flags);
  AddHttpFlags(app, flags);
  AddClientFlowControlFlags(app, flags);
  AddLogFlags(app, &flags->log_options);
}

absl::Status CheckCoordinatorFlags(const CoordinatorFlags& flags) {
  const cluster::SchedulerPolicy& policy = flags.opts.scheduler_policy;
  if (policy.speculative().method() == "replay" && !policy.allow_replay_drafter()) {
    return absl::InvalidArgumentError(
        "--speculative-method replay drafts recorded outputs and is for benchmarks only; add "
        "--allow-replay-drafter");
  }
  if (policy.speculative().method() == "eagle3" && policy.speculative_model().empty()) {
    return absl::InvalidArgumentError(
        "--speculative-method eagle3 needs --speculative-model DIR (or synthetic:eagle3)");
  }
  return absl::OkStatus();
}

}  // namespace flotilla::coordinator
