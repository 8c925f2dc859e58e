#include "tools/cli/up_command.h"

#include <atomic>
#include <csignal>
#include <iostream>
#include <memory>
#include <string>
#include <vector>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "tools/cli/local_cluster.h"
#include "tools/cli/up_banner.h"

namespace flotilla::cli {
namespace {

// SIGINT/SIGTERM received: the first drains, a second stops at once.
std::atomic<int> g_signals{0};
void OnSignal(int) { g_signals.fetch_add(1); }

// The serving limits `flotilla up` passes to its coordinator and workers.
struct ServingLimits {
  uint32_t max_sequences = 256;
  uint32_t max_batch_tokens = 2048;
  // The scheduling policy (the coordinator's flags of the same names).
  std::string scheduling_policy = "shortest-prompt-first";
  uint32_t max_prefill_wait_ms = 1000;
  uint32_t max_num_partial_prefills = 0;
  uint32_t max_long_partial_prefills = 0;
  uint32_t long_prefill_token_threshold = 0;
  // Steps without decode tokens may prefill this many prompt tokens (the
  // coordinator's --idle-prefill-tokens): one 8,192-token step prefills a
  // long prompt on an idle GPU ~20% faster than four 2,048-token chunks.
  uint32_t idle_prefill_tokens = 8192;
  // Speculative decoding (the coordinator's flags of the same names).
  std::string speculative_method = "off";
  std::string speculative_model;  // the EAGLE3 head: a directory or synthetic:eagle3
  uint32_t num_speculative_tokens = 3;
  uint32_t speculative_max_batch = 0;  // 0: the workers' default
  bool allow_replay_drafter = false;
  double replay_error_rate = 0.0;
  uint32_t max_model_len = 0;
  double gpu_memory_utilization = 0.90;
  std::string kv_cache_dtype = "auto";
  std::string moe_activation = "auto";
  double kv_host_cache_gb = 0;  // every worker's host-memory KV tier (0 = off)
  bool deterministic = false;   // every worker's --deterministic
  int ready_timeout_s = 600;
  uint32_t redundant_experts = 0;
  double rebalance_interval = 0;
  double drain_timeout_s = 30;
  // The request field policy (coordinator/http/request_fields.h).
  bool strict_request_fields = false;
  std::string reasoning_field = "both";
  // Origins browsers may call the HTTP API from (the coordinator's CORS).
  std::vector<std::string> allowed_origins;

  void ApplyTo(LocalClusterOptions& o) const {
    o.coordinator_args = {"--max-sequences",
                          std::to_string(max_sequences),
                          "--max-num-batched-tokens",
                          std::to_string(max_batch_tokens),
                          "--scheduling-policy",
                          scheduling_policy,
                          "--max-prefill-wait-ms",
                          std::to_string(max_prefill_wait_ms),
                          "--max-num-partial-prefills",
                          std::to_string(max_num_partial_prefills),
                          "--max-long-partial-prefills",
                          std::to_string(max_long_partial_prefills),
                          "--long-prefill-token-threshold",
                          std::to_string(long_prefill_token_threshold),
                          "--idle-prefill-tokens",
                          std::to_string(idle_prefill_tokens),
                          "--max-model-len",
                          std::to_string(max_model_len),
                          "--redundant-experts",
                          std::to_string(redundant_experts),
                          "--rebalance-interval",
                          std::to_string(rebalance_interval),
                          "--drain-timeout",
                          absl::StrCat(drain_timeout_s),
                          "--reasoning-field",
                          reasoning_field,
                          "--kv-cache-dtype",
                          kv_cache_dtype,
                          "--moe-activation",
                          moe_activation};
    o.coordinator_args.insert(o.coordinator_args.end(),
                              {"--speculative-method", speculative_method,
                               "--num-speculative-tokens", std::to_string(num_speculative_tokens),
                               "--replay-error-rate", absl::StrCat(replay_error_rate)});
    if (!speculative_model.empty()) {
      o.coordinator_args.insert(o.coordinator_args.end(),
                                {"--speculative-model", speculative_model});
    }
    if (speculative_max_batch != 0) {
      o.coordinator_args.insert(o.coordinator_args.end(),
                                {"--speculative-max-batch", std::to_string(speculative_max_batch)});
    }
    if (allow_replay_drafter) o.coordinator_args.push_back("--allow-replay-drafter");
    if (strict_request_fields) o.coordinator_args.push_back("--strict-request-fields");
    if (!allowed_origins.empty()) {
      o.coordinator_args.insert(o.coordinator_args.end(),
                                {"--allowed-origins", absl::StrJoin(allowed_origins, ",")});
    }
    if (kv_host_cache_gb > 0) {
      o.worker_args.insert(o.worker_args.end(),
                           {"--kv-host-cache-gb", absl::StrCat(kv_host_cache_gb)});
    }
    if (deterministic) o.worker_args.push_back("--deterministic");
    o.gpu_memory_utilization = gpu_memory_utilization;
    o.ready_timeout = absl::Seconds(ready_timeout_s);
  }
};

// One line of up's own: "flotilla up: LINE" on stderr, or a JSON log line
// under --log-format json.
void Say(const std::string& line, spdlog::level::level_enum level = spdlog::level::info) {
  if (JsonLogs()) {
    LogEvent(level, line, {{"process", "up"}});
  } else {
    std::cerr << "flotilla up: " << line << std::endl;
  }
}

// Serves until a signal: supervises the children (workers that exit are
// restarted; a coordinator that exits ends everything, exit 1), then drains.
void ServeUntilSignalled(LocalCluster& cluster, double drain_timeout_s) {
  while (g_signals.load() == 0) {
    absl::Status supervised = cluster.Supervise();
    if (!supervised.ok()) {
      Say(absl::StrCat(supervised.message(), "; stopping every process"), spdlog::level::err);
      cluster.Stop(absl::Seconds(2));
      throw CLI::RuntimeError(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Say(absl::StrCat("draining: no new requests, those in flight get up to ", drain_timeout_s,
                   " s (Ctrl-C again stops at once)"));
  // The coordinator keeps its own bound; this one only guards against a hang.
  cluster.Drain(absl::Seconds(drain_timeout_s) + absl::Seconds(10),
                [] { return g_signals.load() > 1; });
  Say("stopped");
}

UpBanner BannerOf(const LocalCluster& cluster, const LocalClusterOptions& o) {
  UpBanner b;
  b.model = cluster.model();
  b.model_id = cluster.model_id();
  b.workers = o.workers;
  b.gpus = cluster.worker_gpus();
  b.grpc_address = cluster.address();
  b.http_address = cluster.http_address();
  b.tls = o.tls.enabled();
  b.tls_ca = o.client_tls.ca;
  if (!o.tls.client_ca.empty()) {
    b.client_cert = o.client_tls.cert;
    b.client_key = o.client_tls.key;
  }
  b.needs_key = !o.api_key_file.empty() || !o.admin_key_file.empty();
  return b;
}

}  // namespace

void AddUpCommand(CLI::App& app) {
  auto o = std::make_shared<LocalClusterOptions>();
  o->listen = "127.0.0.1:50051";
  CLI::App* cmd = app.add_subcommand(
      "up", "Start a coordinator and N workers on this machine and serve until Ctrl-C");
  cmd->add_option("--workers", o->workers, "worker processes (default 1)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--instances", o->instances,
                  "model instances the workers form (--workers must be a multiple): each serves "
                  "on its own, requests are routed among them and move to another when theirs "
                  "fails")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--router", o->router,
                  "with several instances: cache-aware (default), least-loaded or round-robin")
      ->check(CLI::IsMember({"cache-aware", "least-loaded", "round-robin"}));
  cmd->add_option("--migrate-requests", o->migrate_requests,
                  "continue a failed instance's requests elsewhere: auto (on with several "
                  "instances; the default), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--tp", o->tp, "attention tensor-parallel size (0 = automatic)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--device-transport", o->device_transport,
                  "between GPU workers: auto (cuda-ipc on one node), cuda-ipc or nccl")
      ->check(CLI::IsMember({"auto", "cuda-ipc", "nccl"}));
  cmd->add_option("--moe-parallel", o->moe_parallel,
                  "how the MoE layer is split: ep (experts spread over the ranks), tp (every rank "
                  "a slice of every expert) or auto (the coordinator's default: tp for a GPU "
                  "instance of one TP group, else ep)")
      ->check(CLI::IsMember({"auto", "ep", "tp"}));
  cmd->add_option("--model", o->model,
                  "checkpoint directory, or synthetic:PRESET[:SEED] (tiny, 20b, 120b: generated by "
                  "the workers, no files; each also as PRESET-chain, whose outputs follow a fixed "
                  "chain of tokens, for speculative-decoding benchmarks; default: a built-in "
                  "synthetic gpt-oss, cached)");
  cmd->add_option("--listen", o->listen, "coordinator address (port 0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--http-listen", o->http_listen,
                  "OpenAI-compatible HTTP API address (port 0 = any free port; empty = off)")
      ->capture_default_str();
  cmd->add_option("--api-key-file", o->api_key_file,
                  "client API keys, one a line, passed to the coordinator (default: none, the "
                  "APIs are open)")
      ->envname("FLOTILLA_API_KEY_FILE");
  cmd->add_option("--admin-key-file", o->admin_key_file,
                  "admin keys (SetExpertMap, MeasureEngine), passed to the coordinator")
      ->envname("FLOTILLA_ADMIN_KEY_FILE");
  cmd->add_option("--served-model-name", o->served_model_names,
                  "names requests may give as `model` (repeat it or separate with commas; the first "
                  "is the one replies carry), passed to the coordinator")
      ->envname("FLOTILLA_SERVED_MODEL_NAME")->delimiter(',');
  cmd->add_option("--device", o->device,
                  "workers' engine: cpu, or cuda (worker i on visible GPU i % GPUs: several "
                  "workers share a GPU when there are more workers than GPUs)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--gpus", o->gpus,
                  "--device cuda: the GPU ordinals to use, e.g. 0,1 (default: every GPU that "
                  "CUDA_VISIBLE_DEVICES leaves visible)")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--prefix-cache,!--no-prefix-cache", o->prefix_cache,
                "workers share the KV blocks of identical prompt prefixes (default on)");
  cmd->add_option("--threads-per-worker", o->threads_per_worker, "0 = cores / workers")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--log-dir", o->log_dir, "write each process's log here (default: stderr)");
  cmd->add_option("--tls-cert", o->tls.cert,
                  "coordinator's PEM certificate: serve gRPC and HTTP over TLS (with --tls-key)")
      ->envname("FLOTILLA_TLS_CERT");
  cmd->add_option("--tls-key", o->tls.key, "PEM private key of --tls-cert")
      ->envname("FLOTILLA_TLS_KEY");
  cmd->add_option("--tls-client-ca", o->tls.client_ca,
                  "PEM CA: gRPC clients and workers must present a certificate it signed (mTLS)")
      ->envname("FLOTILLA_TLS_CLIENT_CA");
  cmd->add_option("--tls-ca", o->client_tls.ca,
                  "PEM CA the workers (and up itself) verify the coordinator's certificate with")
      ->envname("FLOTILLA_TLS_CA");
  cmd->add_option(
         "--worker-tls-cert", o->client_tls.cert,
         "PEM client certificate of the workers, for --tls-client-ca (with --worker-tls-key)")
      ->envname("FLOTILLA_WORKER_TLS_CERT");
  cmd->add_option("--worker-tls-key", o->client_tls.key, "PEM private key of --worker-tls-cert")
      ->envname("FLOTILLA_WORKER_TLS_KEY");
  auto limits = std::make_shared<ServingLimits>();
  cmd->add_option("--max-sequences", limits->max_sequences,
                  "sequences batched per step (continuous batching)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-batched-tokens,--max-batch-tokens", limits->max_batch_tokens,
                  "token budget of one step (prompt chunks beside the decode tokens)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--scheduling-policy", limits->scheduling_policy,
                  "order of the prompts waiting for prefill: fcfs or shortest-prompt-first")
      ->capture_default_str()->check(CLI::IsMember({"fcfs", "shortest-prompt-first"}));
  cmd->add_option("--max-prefill-wait-ms", limits->max_prefill_wait_ms,
                  "shortest-prompt-first: a prompt waiting this long goes first (0 = no bound)")
      ->capture_default_str();
  cmd->add_option("--max-num-partial-prefills", limits->max_num_partial_prefills,
                  "prompts given a chunk in one step (0 = as many as the budget takes)")
      ->capture_default_str();
  cmd->add_option("--max-long-partial-prefills", limits->max_long_partial_prefills,
                  "of those, prompts longer than --long-prefill-token-threshold (0 = no bound)")
      ->capture_default_str();
  cmd->add_option("--long-prefill-token-threshold", limits->long_prefill_token_threshold,
                  "a longer prompt's chunk is at most this while others want the budget (0 = "
                  "off)")
      ->capture_default_str();
  cmd->add_option("--idle-prefill-tokens", limits->idle_prefill_tokens,
                  "a step with no decode token may prefill up to this many prompt tokens when "
                  "more than --max-num-batched-tokens (workers size their buffers for it; 0 = "
                  "off)")
      ->capture_default_str();
  cmd->add_option("--speculative-method", limits->speculative_method,
                  "speculative decoding for requests that do not choose: ngram (prompt lookup), "
                  "suffix (suffix matching over the request and recent outputs), eagle3 (the "
                  "--speculative-model head), replay (benchmarks only: needs "
                  "--allow-replay-drafter) or off; verified exactly")
      ->capture_default_str()
      ->check(CLI::IsMember({"ngram", "suffix", "eagle3", "replay", "off"}));
  cmd->add_option("--speculative-model", limits->speculative_model,
                  "EAGLE3 draft head for --speculative-method eagle3 and requests choosing it: "
                  "a directory in the published layout (config.json, safetensors) or "
                  "synthetic:eagle3[:SEED] (random weights shaped for the model, for tests)");
  cmd->add_option("--num-speculative-tokens", limits->num_speculative_tokens,
                  "tokens drafted per decode step with --speculative-method")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  cmd->add_option("--speculative-max-batch", limits->speculative_max_batch,
                  "steps with more decoding sequences than this draft nothing (0 = the "
                  "workers' default, 32)")
      ->capture_default_str();
  cmd->add_flag("--allow-replay-drafter", limits->allow_replay_drafter,
                "benchmarks only: requests may choose the replay drafter (flotilla bench serve "
                "--speculative-method replay); workers record deterministic requests' outputs");
  cmd->add_option("--replay-error-rate", limits->replay_error_rate,
                  "replay drafter: probability that each drafted token is wrong (with 3 "
                  "drafted tokens 0.19, 0.31, 0.46, 0.66 give acceptance lengths of about 3, "
                  "2.5, 2, 1.5; with 2: 0, 0.18, 0.38, 0.63)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--max-model-len", limits->max_model_len,
                  "longest sequence served (0 = the model's context)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--gpu-memory-utilization", limits->gpu_memory_utilization,
                  "--device cuda: fraction of each GPU's memory for weights, workspaces and KV "
                  "(workers sharing a GPU split it)")
      ->capture_default_str()->check(CLI::Range(0.05, 1.0));
  cmd->add_option("--kv-cache-dtype", limits->kv_cache_dtype,
                  "full-attention layers' KV cache on every worker: bf16, fp8 (e4m3 with a scale "
                  "per position and head; sliding-window layers stay bf16) or auto (bf16)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}));
  cmd->add_option("--moe-activation", limits->moe_activation,
                  "the experts' inputs on every worker: bf16 (the engine's own precision), fp8 "
                  "(MXFP8 blocks of 32 values, the numerics of a W4A8 MoE; CPU engine only) or "
                  "auto (bf16)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}));
  cmd->add_flag("--deterministic", limits->deterministic,
                "every worker computes deterministically: the same request on the same state gives "
                "the same bits, greedy output repeats exactly (CUDA: a fixed order for each "
                "token's expert sum and no split-input projections, a few percent slower)");
  cmd->add_option("--kv-host-cache-gb", limits->kv_host_cache_gb,
                  "GiB of host memory per worker keeping the prefix cache's blocks its KV pools "
                  "evict, copied back on a later hit instead of recomputed (0 = off)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 4096.0));
  cmd->add_option("--redundant-experts", limits->redundant_experts,
                  "spare expert slots per layer on every worker, for replicas of hot experts")
      ->capture_default_str();
  cmd->add_option("--rebalance-interval", limits->rebalance_interval,
                  "seconds between automatic expert rebalances (0 = off; flotillactl rebalance "
                  "on request)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--ready-timeout-s", limits->ready_timeout_s,
                  "how long to wait for every worker to load (a 120b load takes minutes)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--drain-timeout", limits->drain_timeout_s,
                  "on Ctrl-C/SIGTERM: seconds the requests in flight get to finish while new ones "
                  "are refused; a second signal stops at once")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_flag("--strict-request-fields", limits->strict_request_fields,
                "refuse request fields the server does not know (400 naming them) instead of "
                "ignoring them with the x-flotilla-ignored-fields header");
  cmd->add_option("--reasoning-field", limits->reasoning_field,
                  "where chat replies carry reasoning text: reasoning, reasoning_content or both")
      ->capture_default_str()
      ->check(CLI::IsMember({"reasoning", "reasoning_content", "both"}));
  cmd->add_option("--allowed-origins", limits->allowed_origins,
                  "origins browsers may call the HTTP API from (CORS), comma-separated, or *; "
                  "passed to the coordinator (default: none)")
      ->delimiter(',');
  cmd->callback([o, limits, &app] {
    limits->ApplyTo(*o);
    // The children log like up itself (--log-level, --log-format are flotilla's).
    o->log_level = app.get_option("--log-level")->as<std::string>();
    o->log_format = app.get_option("--log-format")->as<std::string>();
    std::signal(SIGINT, OnSignal);
    std::signal(SIGTERM, OnSignal);
    o->interrupted = [] { return g_signals.load() > 0; };
    o->progress = [](const std::string& line) { Say(line); };
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(*o);
    if (!cluster.ok()) {
      Say(std::string(cluster.status().message()), spdlog::level::err);
      throw CLI::RuntimeError(absl::IsCancelled(cluster.status()) ? 130 : 1);
    }
    const UpBanner banner = BannerOf(**cluster, *o);
    std::cout << (JsonLogs() ? BannerJson(banner) : BannerText(banner)) << std::flush;
    ServeUntilSignalled(**cluster, limits->drain_timeout_s);
  });
}

}  // namespace flotilla::cli
