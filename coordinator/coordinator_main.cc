// flotilla-coordinator: the control plane and front door of one model instance.
// Every flag also reads a FLOTILLA_* environment variable (same name, upper
// case, dashes as underscores), so pods and laptops start it the same way.
// The flags are declared in coordinator_flags.{h,cc}; this file starts the
// cluster and its listeners, serves until a signal, drains and stops.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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
#include "coordinator/coordinator_flags.h"
#include "coordinator/grpc/reflection_v1.h"
#include "coordinator/grpc/services.h"
#include "coordinator/http/http_server.h"
#include "coordinator/input_limits.h"
#include "coordinator/served_models.h"
#include "spdlog/spdlog.h"

namespace flotilla::coordinator {
namespace {

// SIGINT/SIGTERM received: the first drains, a second stops at once.
std::atomic<int> g_signals{0};
void OnSignal(int) { g_signals.fetch_add(1); }

// Prints "flotilla-coordinator: MESSAGE" on stderr and returns `exit_code`:
// 1 for a listener that cannot serve, 2 for a configuration error.
int Fail(absl::string_view message, int exit_code) {
  std::cerr << "flotilla-coordinator: " << message << "\n";
  return exit_code;
}

// Writes `port` to `path` (nothing when `path` is empty) through a rename, so
// a script waiting for the file never reads half of it.
void WritePortFile(const std::string& path, int port) {
  if (path.empty()) return;
  std::ofstream(path + ".tmp") << port << "\n";
  std::rename((path + ".tmp").c_str(), path.c_str());
}

// The listen addresses, parsed, and the credentials every listener serves with.
struct Listeners {
  ListenAddress grpc_address;
  ListenAddress http_address;   // unset without --http-listen
  ListenAddress admin_address;  // unset without --admin-listen
  std::shared_ptr<grpc::ServerCredentials> credentials;
};

// Addresses, ports and TLS files are checked before anything starts: a taken
// port or a bad file is a clear error and exit 1 within milliseconds.
absl::StatusOr<Listeners> CheckListeners(const CoordinatorFlags& flags) {
  absl::StatusOr<ListenAddress> grpc_address = ParseListenAddress(flags.listen, "--listen");
  absl::StatusOr<ListenAddress> http_address =
      flags.http_listen.empty() ? ListenAddress()
                                : ParseListenAddress(flags.http_listen, "--http-listen");
  absl::Status startup = grpc_address.status();
  if (startup.ok()) startup = http_address.status();
  if (startup.ok()) startup = CheckPortFree(*grpc_address, "--listen");
  if (startup.ok() && !flags.http_listen.empty()) {
    startup = CheckPortFree(*http_address, "--http-listen");
  }
  absl::StatusOr<ListenAddress> admin_address =
      flags.admin_listen.empty() ? ListenAddress()
                                 : ParseListenAddress(flags.admin_listen, "--admin-listen");
  if (startup.ok()) startup = admin_address.status();
  if (startup.ok() && !flags.admin_listen.empty()) {
    startup = CheckPortFree(*admin_address, "--admin-listen");
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(flags.tls);
  if (startup.ok()) startup = credentials.status();
  if (!startup.ok()) return startup;
  return Listeners{*std::move(grpc_address), *std::move(http_address), *std::move(admin_address),
                   *std::move(credentials)};
}

// The cluster's options: those the flags filled in directly, the rest turned
// into their types, and the model's config (its error is a configuration
// error).
absl::StatusOr<ClusterOptions> MakeClusterOptions(const CoordinatorFlags& flags) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(flags.model);
  if (!config.ok()) return config.status();
  ClusterOptions opts = flags.opts;
  opts.expected_workers = flags.workers;
  opts.router = *ParseRouterPolicy(flags.router);  // checked by IsMember
  opts.migrate_requests = flags.migrate == "on" || (flags.migrate == "auto" && opts.instances > 1);
  opts.migration_wait = absl::Seconds(flags.migration_wait_s);
  // Checked by NameCheck at parse time.
  opts.comm_backend = *ParseCommBackend(flags.comm);
  opts.layout = {flags.tp, flags.dp, *ParseDeviceTransport(flags.device_transport),
                 *ParseMoeLayout(flags.moe_parallel)};
  opts.model_path = flags.model;
  opts.model = *std::move(config);
  opts.heartbeat_interval = absl::Milliseconds(flags.hb_interval_ms);
  opts.heartbeat_timeout = absl::Milliseconds(flags.hb_timeout_ms);
  opts.forget_dead_workers_after = absl::Seconds(flags.forget_dead_workers_s);
  opts.max_prompt_logits_bytes = flags.max_prompt_logits_mb << 20;
  opts.expert_window = absl::Seconds(flags.expert_window_s);
  opts.rebalance_interval = absl::Seconds(flags.rebalance_interval_s);
  return opts;
}

// The cluster and the services in front of it, in the order they are made
// (so they are destroyed in reverse, the cluster last).
struct Services {
  std::unique_ptr<ClusterManager> manager;
  std::vector<std::string> served_names;  // the model id first
  std::unique_ptr<Authenticator> auth;
  std::unique_ptr<ClusterControlService> control;
  std::unique_ptr<AdminService> admin;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<FrontendService> frontend;
  InputLimits limits;
  std::shared_ptr<ClientBuffers> buffers;

  const std::string& model_id() const { return served_names.front(); }
};

// Says who can reach the APIs when keys leave them open, or the admin calls
// refused.
void LogKeyPolicy(const Authenticator& auth, const std::string& listen) {
  if (auth.open()) {
    spdlog::warn(
        "no --api-key-file or --admin-key-file: the client and admin APIs are open to "
        "anyone who can reach {}",
        listen);
  } else if (!auth.has_admin_keys()) {
    spdlog::info("no --admin-key-file: SetExpertMap and MeasureEngine are refused");
  }
}

// The token workers must present (--cluster-token-file), or none, with a
// warning that anyone may then join.
absl::StatusOr<std::optional<std::string>> ReadClusterToken(const CoordinatorFlags& flags) {
  if (flags.cluster_token_file.empty()) {
    spdlog::warn(
        "no --cluster-token-file: any process that can reach {} can join as a worker, "
        "take a rank and see and answer requests",
        flags.listen);
    return std::nullopt;
  }
  absl::StatusOr<std::string> token = ReadClusterTokenFile(flags.cluster_token_file);
  if (!token.ok()) {
    return absl::Status(token.status().code(),
                        absl::StrCat("--cluster-token-file: ", token.status().message()));
  }
  return *std::move(token);
}

// The client API's gRPC service, with its input limits, cache domains, served
// names and the flow control toward clients it shares with the HTTP API.
void CreateFrontend(const CoordinatorFlags& flags, const ClusterOptions& opts, Services* services) {
  services->frontend = std::make_unique<FrontendService>(
      services->manager.get(), services->model_id(), services->tokenizer.get(),
      harmony::OpenAiRequestOptions(), services->auth.get());
  services->limits.max_request_bytes = flags.max_request_bytes;
  services->limits.max_prompt_text_bytes =
      PromptTextByteLimit(opts.model.max_position_embeddings, *services->tokenizer);
  services->frontend->SetInputLimits(services->limits);
  services->frontend->SetCacheDomains(flags.cache_domains);
  services->frontend->SetServedModelNames(services->served_names);
  ClientBufferOptions client_buffers = flags.client_buffers;
  client_buffers.stall_grace = absl::Seconds(flags.client_stall_timeout_s);
  client_buffers.max_open_requests = opts.max_inflight_requests;
  services->buffers = ClientBuffers::Create(client_buffers);
  services->frontend->SetClientBuffers(services->buffers);
}

// Creates the cluster and its services; every error is a configuration error.
absl::StatusOr<Services> CreateServices(const CoordinatorFlags& flags, const ClusterOptions& opts) {
  Services services;
  absl::StatusOr<std::unique_ptr<ClusterManager>> manager = ClusterManager::Create(opts);
  if (!manager.ok()) return manager.status();
  services.manager = *std::move(manager);
  absl::StatusOr<std::vector<std::string>> served_names =
      ServedModelNames(flags.served_model_names,
                       flags.model_id.empty() ? DefaultModelId(flags.model) : flags.model_id);
  if (!served_names.ok()) return served_names.status();
  services.served_names = *std::move(served_names);
  absl::StatusOr<std::unique_ptr<Authenticator>> auth =
      Authenticator::Create(flags.api_key_file, flags.admin_key_file);
  if (!auth.ok()) return auth.status();
  services.auth = *std::move(auth);
  if (!flags.metrics_listen.empty() && flags.http_listen.empty()) {
    return absl::InvalidArgumentError("--metrics-listen needs the HTTP API (--http-listen)");
  }
  LogKeyPolicy(*services.auth, flags.listen);
  absl::StatusOr<std::optional<std::string>> cluster_token = ReadClusterToken(flags);
  if (!cluster_token.ok()) return cluster_token.status();
  services.control =
      std::make_unique<ClusterControlService>(services.manager.get(), *std::move(cluster_token));
  services.admin = std::make_unique<AdminService>(services.manager.get(), services.auth.get());
  absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tokenizer =
      tokenizer::Tokenizer::Create(flags.tokenizer_path);
  if (!tokenizer.ok()) {
    return absl::Status(
        tokenizer.status().code(),
        absl::StrCat("--tokenizer ", flags.tokenizer_path, ": ", tokenizer.status().message()));
  }
  services.tokenizer = *std::move(tokenizer);
  CreateFrontend(flags, opts, &services);
  return services;
}

// The listeners, in the order they start (so they are destroyed in reverse).
struct Servers {
  std::unique_ptr<ReflectionV1Service> reflection_v1;
  std::unique_ptr<grpc::Server> grpc_server;
  int grpc_port = 0;
  std::unique_ptr<grpc::Server> admin_server;  // with --admin-listen
  std::unique_ptr<HttpServer> http_server;     // with --http-listen
};

// v1alpha: Debian's plugin, registered with every ServerBuilder made from
// here on. v1: ours, answering from the same descriptors with the same list.
std::unique_ptr<ReflectionV1Service> StartReflection(const CoordinatorFlags& flags) {
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::vector<std::string> services = {cluster::ClusterControl::service_full_name(),
                                       v1::Flotilla::service_full_name(), "grpc.health.v1.Health",
                                       "grpc.reflection.v1alpha.ServerReflection",
                                       grpc::reflection::v1::ServerReflection::service_full_name()};
  if (flags.admin_listen.empty()) services.push_back(admin::Admin::service_full_name());
  return std::make_unique<ReflectionV1Service>(std::move(services));
}

// The gRPC server on --listen: cluster control, the client API, health,
// reflection and, without --admin-listen, the admin API.
absl::Status StartGrpcServer(const CoordinatorFlags& flags, const Listeners& listeners,
                             Services& services, Servers* servers) {
  grpc::EnableDefaultHealthCheckService(true);
  if (flags.grpc_reflection) servers->reflection_v1 = StartReflection(flags);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listeners.grpc_address.ToString(), listeners.credentials,
                           &servers->grpc_port);
  builder.RegisterService(services.control.get());
  if (flags.admin_listen.empty()) builder.RegisterService(services.admin.get());
  builder.RegisterService(services.frontend.get());
  if (servers->reflection_v1) builder.RegisterService(servers->reflection_v1.get());
  // The transport refuses anything over the larger of the client limit and the
  // workers' session messages; the frontend holds client calls to theirs.
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<size_t>(std::max(flags.max_request_bytes, kWorkerSessionMessageBytes), INT32_MAX)));
  builder.SetMaxSendMessageSize(256 << 20);
  // A second server on a taken port must fail, not share it (gRPC sets
  // SO_REUSEPORT by default).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  servers->grpc_server = builder.BuildAndStart();
  if (!servers->grpc_server || servers->grpc_port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "--listen ", flags.listen, ": cannot listen on port ", listeners.grpc_address.port));
  }
  return absl::OkStatus();
}

// The admin API alone on its own address (--admin-listen); its bound port
// goes to `port_file` when one is named.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartAdminServer(
    const ListenAddress& address, const std::shared_ptr<grpc::ServerCredentials>& creds,
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
  WritePortFile(port_file, port);
  return server;
}

// The HTTP server's options: those the flags filled in directly, the rest
// from the other flags and the services it shares with the gRPC API.
HttpServerOptions MakeHttpOptions(const CoordinatorFlags& flags, const Services& services) {
  HttpServerOptions options = flags.http_options;
  options.connections.header_timeout = absl::Seconds(flags.header_timeout_s);
  options.connections.body_timeout = absl::Seconds(flags.body_timeout_s);
  options.connections.idle_timeout = absl::Seconds(flags.idle_timeout_s);
  options.responses_store.max_age = absl::Seconds(flags.responses_ttl_s);
  options.listen = flags.http_listen;
  options.model_id = services.model_id();
  options.served_model_names = services.served_names;
  if (!services.auth->open()) options.auth = services.auth.get();
  options.metrics_listen = flags.metrics_listen;
  options.metrics_for_clients = flags.metrics_for_clients;
  options.cors = *CorsPolicy::Create(flags.allowed_origins);  // checked at parse time
  options.limits = services.limits;
  options.cache_domains = flags.cache_domains;
  options.unknown_fields =
      flags.strict_request_fields ? UnknownFields::kRefuse : UnknownFields::kIgnore;
  options.reasoning_field = *ParseReasoningField(flags.reasoning_field);
  options.client_buffers = services.buffers;
  options.tls = flags.tls;
  return options;
}

// The OpenAI-compatible HTTP API (--http-listen) and, with --metrics-listen,
// its /metrics listener; their bound ports go to their port files.
absl::Status StartHttpServer(const CoordinatorFlags& flags, const Services& services,
                             Servers* servers) {
  absl::StatusOr<std::unique_ptr<HttpServer>> created = HttpServer::Create(
      MakeHttpOptions(flags, services), services.manager.get(), services.tokenizer.get());
  if (!created.ok()) return created.status();
  servers->http_server = *std::move(created);
  const HttpServer& http = *servers->http_server;
  spdlog::info("OpenAI-compatible HTTP API on {}:{}",
               flags.http_listen.substr(0, flags.http_listen.rfind(':')), http.port());
  WritePortFile(flags.http_port_file, http.port());
  if (http.metrics_port() > 0) {
    spdlog::info("/metrics (no key) on {}:{}",
                 flags.metrics_listen.substr(0, flags.metrics_listen.rfind(':')),
                 http.metrics_port());
    WritePortFile(flags.metrics_port_file, http.metrics_port());
  }
  return absl::OkStatus();
}

// Starts every listener, the gRPC one first; once all serve, the bound gRPC
// port goes to --port-file (a script waiting for it finds every port bound).
// An error leaves those already started in `servers`, the gRPC one shut down.
absl::Status StartServers(const CoordinatorFlags& flags, const Listeners& listeners,
                          Services& services, Servers* servers) {
  if (absl::Status started = StartGrpcServer(flags, listeners, services, servers); !started.ok()) {
    return started;
  }
  if (!flags.admin_listen.empty()) {
    absl::StatusOr<std::unique_ptr<grpc::Server>> started =
        StartAdminServer(listeners.admin_address, listeners.credentials, services.admin.get(),
                         flags.admin_port_file);
    if (!started.ok()) {
      servers->grpc_server->Shutdown();
      return started.status();
    }
    servers->admin_server = *std::move(started);
  }
  if (!flags.http_listen.empty()) {
    if (absl::Status started = StartHttpServer(flags, services, servers); !started.ok()) {
      servers->grpc_server->Shutdown();
      return started;
    }
  }
  std::string host = flags.listen.substr(0, flags.listen.rfind(':'));
  spdlog::info("coordinator listening on {}:{} for {} workers (model {})", host, servers->grpc_port,
               flags.workers, services.model_id());
  WritePortFile(flags.port_file, servers->grpc_port);
  return absl::OkStatus();
}

// Serves until SIGINT or SIGTERM. gRPC health follows the instance: SERVING
// only while it can take requests (the overall "" service stays SERVING while
// the process is up, for liveness).
void ServeUntilSignal(grpc::Server& server, ClusterManager& manager) {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  bool serving = false;
  health->SetServingStatus("flotilla.v1.Flotilla", false);
  while (g_signals.load() == 0) {
    const bool ready = manager.Status().state() == admin::READY;
    if (ready != serving) {
      health->SetServingStatus("flotilla.v1.Flotilla", ready);
      serving = ready;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  health->SetServingStatus("flotilla.v1.Flotilla", false);
}

// Drains the requests in flight (up to --drain-timeout, or until a second
// signal), then stops the listeners.
void DrainAndStop(const CoordinatorFlags& flags, ClusterManager& manager, Servers& servers) {
  spdlog::info("coordinator stopping: draining for up to {} s (a second signal stops at once)",
               flags.drain_timeout_s);
  const DrainResult drained =
      Drain(manager, absl::Seconds(flags.drain_timeout_s), [] { return g_signals.load() > 1; });
  spdlog::info("{}", DescribeDrain(drained));
  // Streams that just ended still write their last messages (after a second
  // signal, the status that says so): give them a moment, a short one when told
  // to stop at once. Both stops return as soon as no call is left.
  const absl::Duration grace_period = drained.interrupted ? absl::Seconds(1) : absl::Seconds(2);
  const auto grace = absl::ToChronoTime(absl::Now() + grace_period);
  if (servers.http_server) servers.http_server->Stop(grace_period);
  if (servers.admin_server) servers.admin_server->Shutdown(grace);
  servers.grpc_server->Shutdown(grace);
  spdlog::info("coordinator stopped");
}

int Main(int argc, char** argv) {
  ReturnLargeBuffersToSystem();
  CLI::App app{"flotilla-coordinator: places workers and serves the client API"};
  CoordinatorFlags flags;
  AddCoordinatorFlags(app, &flags);
  NameEnvironmentVariables(app);
  AddVersionFlag(app, "flotilla-coordinator");
  AddConfigFlag(app);
  if (std::optional<int> exit_code = ParseCommandLine(app, argc, argv)) return *exit_code;
  if (absl::Status checked = CheckCoordinatorFlags(flags); !checked.ok()) {
    return Fail(checked.message(), 2);
  }
  SetAccessLogIds(flags.access_log_ids);
  if (absl::Status logging = ConfigureLogging(flags.log_options); !logging.ok()) {
    return Fail(logging.message(), 2);
  }
  absl::StatusOr<Listeners> listeners = CheckListeners(flags);
  if (!listeners.ok()) return Fail(listeners.status().message(), 1);
  absl::StatusOr<ClusterOptions> opts = MakeClusterOptions(flags);
  if (!opts.ok()) return Fail(opts.status().message(), 2);
  absl::StatusOr<Services> services = CreateServices(flags, *opts);
  if (!services.ok()) return Fail(services.status().message(), 2);
  Servers servers;
  if (absl::Status started = StartServers(flags, *listeners, *services, &servers); !started.ok()) {
    return Fail(started.message(), 1);
  }
  ServeUntilSignal(*servers.grpc_server, *services->manager);
  DrainAndStop(flags, *services->manager, servers);
  return 0;
}

}  // namespace
}  // namespace flotilla::coordinator

int main(int argc, char** argv) { return flotilla::coordinator::Main(argc, argv); }
