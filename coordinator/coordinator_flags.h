// The command line of flotilla-coordinator: every value its flags set, with
// the defaults it serves with, and the CLI11 options that fill them. Each
// flag also reads a FLOTILLA_* environment variable (NameEnvironmentVariables,
// called by the program once every option is added).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/logging.h"
#include "common/tls_credentials.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/cache_domain.h"
#include "coordinator/client_buffers.h"
#include "coordinator/cluster/cluster_types.h"
#include "coordinator/http/http_server.h"
#include "coordinator/input_limits.h"

namespace CLI {
class App;
}

namespace flotilla::coordinator {

// What the flags say, as parsed. Values with a ClusterOptions or
// HttpServerOptions field of their own are parsed straight into `opts` and
// `http_options`; the rest (durations in seconds, names checked at parse
// time) are turned into those options once parsing is done.
struct CoordinatorFlags {
  // The model and the cluster's shape.
  std::string listen = "127.0.0.1:50051";
  std::string model;
  std::string model_id;  // empty: DefaultModelId(model)
  std::vector<std::string> served_model_names;
  int workers = 1;
  std::string router = "cache-aware";
  std::string migrate = "auto";
  double migration_wait_s = 30;
  int tp = 0;
  int dp = 0;
  std::string comm = "ucx";
  std::string device_transport = "auto";
  std::string moe_parallel = "auto";
  int hb_interval_ms = 250;
  int hb_timeout_ms = 2000;
  double drain_timeout_s = 30;
  int forget_dead_workers_s = 60;
  ClusterOptions opts;
  // Scheduling (the rest is in opts).
  uint64_t max_prompt_logits_mb = opts.max_prompt_logits_bytes >> 20;
  // Expert balancing (the rest is in opts).
  double expert_window_s = 10;
  double rebalance_interval_s = 0;
  // Listeners and the files their bound ports go to.
  std::string tokenizer_path = tokenizer::Tokenizer::DefaultRanksPath();
  std::string port_file;
  std::string http_listen = "127.0.0.1:8000";  // empty: no HTTP API
  std::string http_port_file;
  bool grpc_reflection = true;
  std::string metrics_listen;
  std::string metrics_port_file;
  std::string admin_listen;  // empty: the admin API is on --listen
  std::string admin_port_file;
  // Keys, tenants and TLS.
  std::string api_key_file;
  std::string admin_key_file;
  CacheDomainPolicy cache_domains;
  bool access_log_ids = false;
  bool metrics_for_clients = false;
  std::vector<std::string> allowed_origins;
  std::string cluster_token_file;
  size_t max_request_bytes = kDefaultMaxRequestBytes;
  TlsServerFiles tls;
  // The HTTP front end (the rest is in http_options).
  HttpServerOptions http_options;
  double header_timeout_s = 10;
  double body_timeout_s = 60;
  double idle_timeout_s = 60;
  double responses_ttl_s = 3600;
  bool strict_request_fields = false;
  std::string reasoning_field = "both";
  // Flow control toward clients (client_buffers.h).
  ClientBufferOptions client_buffers;
  double client_stall_timeout_s = 10;
  LogOptions log_options;
};

// Adds every flag of flotilla-coordinator to `app`, filling `flags` (which
// must outlive the parse), in the order --help lists them.
void AddCoordinatorFlags(CLI::App& app, CoordinatorFlags* flags);

// The rules between flags that CLI11 cannot check one flag at a time: a
// --speculative-method that needs another flag. INVALID_ARGUMENT naming both.
absl::Status CheckCoordinatorFlags(const CoordinatorFlags& flags);

}  // namespace flotilla::coordinator
