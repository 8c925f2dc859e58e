#include "tools/cli/up_command.h"

#include <csignal>
#include <iostream>
#include <memory>
#include <thread>

#include "tools/cli/local_cluster.h"

namespace flotilla::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

}  // namespace

void AddUpCommand(CLI::App& app) {
  auto o = std::make_shared<LocalClusterOptions>();
  o->listen = "127.0.0.1:50051";
  CLI::App* cmd = app.add_subcommand(
      "up", "Start a coordinator and N workers on this machine and serve until Ctrl-C");
  cmd->add_option("--workers", o->workers, "worker processes (default 1)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tp", o->tp, "attention tensor-parallel size (0 = automatic)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--model", o->model,
                  "checkpoint directory (default: a built-in synthetic gpt-oss, cached)");
  cmd->add_option("--listen", o->listen, "coordinator address (port 0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--http-listen", o->http_listen,
                  "OpenAI-compatible HTTP API address (port 0 = any free port; empty = off)")
      ->capture_default_str();
  cmd->add_option("--device", o->device,
                  "workers' engine: cpu, or cuda (each worker holds the whole model on its GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--prefix-cache,!--no-prefix-cache", o->prefix_cache,
                "workers share the KV blocks of identical prompt prefixes (default on)");
  cmd->add_option("--threads-per-worker", o->threads_per_worker, "0 = cores / workers")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--log-dir", o->log_dir, "write each process's log here (default: stderr)");
  cmd->callback([o] {
    std::signal(SIGINT, OnSignal);
    std::signal(SIGTERM, OnSignal);
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(*o);
    if (!cluster.ok()) {
      std::cerr << "flotilla up: " << cluster.status().message() << "\n";
      throw CLI::RuntimeError(1);
    }
    std::cout << "flotilla up: serving " << (*cluster)->model() << " with " << o->workers
              << " worker(s) at " << (*cluster)->address() << "\n"
              << "  try: flotilla generate --coordinator " << (*cluster)->address()
              << " --prompt-ids 1,2,3 --max-tokens 8 --json\n"
              << ((*cluster)->http_address().empty()
                      ? std::string()
                      : "  OpenAI-compatible API: http://" + (*cluster)->http_address() + "/v1\n")
              << "  Ctrl-C stops every process it started." << std::endl;
    while (!g_stop) {
      absl::Status alive = (*cluster)->CheckAlive();
      if (!alive.ok()) std::cerr << "flotilla up: " << alive.message() << "\n";
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    std::cout << "flotilla up: stopping" << std::endl;
    (*cluster)->Stop();
  });
}

}  // namespace flotilla::cli
