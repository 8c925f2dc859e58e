// flotilla-coordinator: the control plane and front door of one model instance.
// Every flag also reads a FLOTILLA_* environment variable (same name, upper
// case, dashes as underscores), so pods and laptops start it the same way.
#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <csignal>
#include <fstream>
#include <iostream>

#include "coordinator/cluster_manager.h"
#include "coordinator/http_server.h"
#include "coordinator/services.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "spdlog/spdlog.h"

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flotilla-coordinator: places workers and serves the client API"};
  std::string listen = "127.0.0.1:50051";
  std::string model;
  std::string model_id;
  std::string port_file;
  int workers = 1, tp = 0, dp = 0;
  int hb_interval_ms = 250, hb_timeout_ms = 2000;
  flotilla::coordinator::ClusterOptions opts;
  app.add_option("--listen", listen, "address:port for workers, clients and admin (port 0 = any)")
      ->envname("FLOTILLA_LISTEN")->capture_default_str();
  app.add_option("--model", model, "checkpoint directory (Hugging Face layout)")
      ->envname("FLOTILLA_MODEL")->required();
  app.add_option("--model-id", model_id, "model name clients use (default: the directory name)")
      ->envname("FLOTILLA_MODEL_ID");
  app.add_option("--workers", workers, "workers in the instance")
      ->envname("FLOTILLA_WORKERS")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--tp", tp, "attention tensor-parallel size (0 = automatic)")
      ->envname("FLOTILLA_TP")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--dp", dp, "data-parallel attention groups (0 = automatic)")
      ->envname("FLOTILLA_DP")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--comm", opts.comm_backend, "communicator between workers: ucx or nccl")
      ->envname("FLOTILLA_COMM")->capture_default_str()->check(CLI::IsMember({"ucx", "nccl"}));
  app.add_option("--heartbeat-interval-ms", hb_interval_ms, "how often workers report")
      ->envname("FLOTILLA_HEARTBEAT_INTERVAL_MS")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--heartbeat-timeout-ms", hb_timeout_ms, "silence after which a worker is dead")
      ->envname("FLOTILLA_HEARTBEAT_TIMEOUT_MS")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--max-inflight", opts.max_inflight_requests,
                 "requests in flight before RESOURCE_EXHAUSTED")
      ->envname("FLOTILLA_MAX_INFLIGHT")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--max-batch-tokens", opts.max_batch_tokens, "token budget of one step")
      ->envname("FLOTILLA_MAX_BATCH_TOKENS")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--max-sequences", opts.max_sequences, "sequences running per DP group")
      ->envname("FLOTILLA_MAX_SEQUENCES")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--max-model-len", opts.max_model_len,
                 "longest sequence (prompt + output) served; 0 = the model's context")
      ->envname("FLOTILLA_MAX_MODEL_LEN")->capture_default_str()->check(CLI::NonNegativeNumber);
  uint64_t max_prompt_logits_mb = opts.max_prompt_logits_bytes >> 20;
  app.add_option("--max-prompt-logits-mb", max_prompt_logits_mb,
                 "largest return_prompt_logits answer (prompt tokens x vocab x 4 bytes) served; "
                 "larger requests are refused with INVALID_ARGUMENT")
      ->envname("FLOTILLA_MAX_PROMPT_LOGITS_MB")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--kv-blocks", opts.kv_blocks, "KV blocks per worker (0 = sized automatically)")
      ->envname("FLOTILLA_KV_BLOCKS")->capture_default_str();
  std::string tokenizer_path = flotilla::tokenizer::Tokenizer::DefaultRanksPath();
  app.add_option("--tokenizer", tokenizer_path, "o200k_harmony ranks file")
      ->envname("FLOTILLA_TOKENIZER")->capture_default_str();
  app.add_option("--port-file", port_file, "write the bound port here once listening")
      ->envname("FLOTILLA_PORT_FILE");
  std::string http_listen = "127.0.0.1:8000";
  std::string http_port_file;
  app.add_option("--http-listen", http_listen,
                 "host:port of the OpenAI-compatible HTTP API (port 0 = any; empty = off)")
      ->envname("FLOTILLA_HTTP_LISTEN")->capture_default_str();
  app.add_option("--http-port-file", http_port_file, "write the bound HTTP port here once listening")
      ->envname("FLOTILLA_HTTP_PORT_FILE");
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<flotilla::ModelConfig> config = flotilla::ModelConfig::Load(model);
  if (!config.ok()) {
    std::cerr << "flotilla-coordinator: " << config.status().message() << "\n";
    return 2;
  }
  opts.expected_workers = workers;
  opts.layout = {tp, dp};
  opts.model_path = model;
  opts.model = *config;
  opts.heartbeat_interval = absl::Milliseconds(hb_interval_ms);
  opts.heartbeat_timeout = absl::Milliseconds(hb_timeout_ms);
  opts.max_prompt_logits_bytes = max_prompt_logits_mb << 20;
  auto manager = flotilla::coordinator::ClusterManager::Create(opts);
  if (!manager.ok()) {
    std::cerr << "flotilla-coordinator: " << manager.status().message() << "\n";
    return 2;
  }
  if (model_id.empty()) {
    std::string m = model;
    while (m.size() > 1 && m.back() == '/') m.pop_back();
    model_id = m.substr(m.find_last_of('/') + 1);
  }

  flotilla::coordinator::ClusterControlService control(manager->get());
  flotilla::coordinator::AdminService admin(manager->get());
  auto tokenizer = flotilla::tokenizer::Tokenizer::Create(tokenizer_path);
  if (!tokenizer.ok()) {
    std::cerr << "flotilla-coordinator: --tokenizer " << tokenizer_path << ": "
              << tokenizer.status().message() << "\n";
    return 2;
  }
  flotilla::coordinator::FrontendService frontend(manager->get(), model_id, tokenizer->get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&control);
  builder.RegisterService(&admin);
  builder.RegisterService(&frontend);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "flotilla-coordinator: cannot listen on " << listen << "\n";
    return 1;
  }
  std::unique_ptr<flotilla::coordinator::HttpServer> http;
  if (!http_listen.empty()) {
    flotilla::coordinator::HttpServerOptions http_options;
    http_options.listen = http_listen;
    http_options.model_id = model_id;
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
  while (!g_stop) {
    const bool ready = (*manager)->Status().state() == flotilla::admin::READY;
    if (ready != serving) {
      health->SetServingStatus("flotilla.v1.Flotilla", ready);
      serving = ready;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  spdlog::info("coordinator stopping");
  if (http) http->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
