// flotillactl: the operator CLI over the coordinator's admin API.
// Every flag also reads FLOTILLA_<FLAG> (--coordinator: FLOTILLA_COORDINATOR).
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "common/command_line.h"
#include "common/config_file.h"
#include "tools/ctl/ctl_commands.h"

using flotilla::ctl::Connection;
using flotilla::ctl::ConnectionOptions;

int main(int argc, char** argv) {
  CLI::App app{"flotillactl: status, expert load, rebalancing and drain of a Flotilla instance"};
  app.require_subcommand(1);
  app.fallthrough();  // --coordinator, --json, ... also after the command
  ConnectionOptions conn;
  flotilla::ctl::OutputOptions out;
  app.add_option("--coordinator", conn.coordinator, "coordinator HOST:PORT (its gRPC port)")
      ->envname("FLOTILLA_COORDINATOR")
      ->capture_default_str();
  app.add_option("--api-key", conn.api_key, "admin key (mutating calls need one when keys are on)")
      ->envname("FLOTILLA_API_KEY");
  app.add_option("--tls-ca", conn.tls.ca, "CA that signed the coordinator's certificate")
      ->envname("FLOTILLA_TLS_CA");
  app.add_option("--tls-cert", conn.tls.cert, "client certificate (for --tls-client-ca servers)")
      ->envname("FLOTILLA_TLS_CERT");
  app.add_option("--tls-key", conn.tls.key, "key of --tls-cert")->envname("FLOTILLA_TLS_KEY");
  app.add_option("--timeout", conn.timeout_s, "seconds a call may take")
      ->envname("FLOTILLA_TIMEOUT")
      ->capture_default_str();
  app.add_flag("--json", out.json, "one JSON object per answer instead of tables")
      ->envname("FLOTILLA_JSON");

  auto* status = app.add_subcommand("status", "instance state, workers, placement, map version");
  flotilla::ctl::ExpertsOptions experts;
  auto* experts_cmd =
      app.add_subcommand("experts", "per-layer, per-rank expert load and imbalance");
  experts_cmd->add_option("--layer", experts.layer, "only this layer (default: every layer)");
  experts_cmd->add_option("--window", experts.window_s,
                          "seconds of load (default: the coordinator's)");
  experts_cmd->add_option("--watch", experts.watch_s, "refresh every SECONDS")
      ->expected(0, 1)
      ->default_str("2");
  experts_cmd->add_option("--count", experts.watch_count, "with --watch: stop after N refreshes");
  experts_cmd->add_option("--instance", experts.instance, "which model instance (default 0)");
  flotilla::ctl::RebalanceOptions rebalance;
  auto* rebalance_cmd = app.add_subcommand("rebalance", "plan a new expert map and apply it");
  rebalance_cmd->add_flag("--dry-run", rebalance.dry_run, "plan and print, apply nothing");
  rebalance_cmd->add_option("--max-bytes", rebalance.max_bytes, "expert bytes to load at most");
  rebalance_cmd->add_option("--window", rebalance.window_s, "seconds of load to plan from");
  rebalance_cmd->add_option("--instance", rebalance.instance, "which model instance (default 0)");
  std::string worker, file;
  int instance = -1;
  auto* drain = app.add_subcommand(
      "drain",
      "stop admitting requests to WORKER's DP group, or with --instance N to a whole instance "
      "(its requests in flight move to other instances; then it can be restarted)");
  auto* undrain = app.add_subcommand(
      "undrain", "admit requests to WORKER's DP group (or --instance N) again");
  for (CLI::App* cmd : {drain, undrain}) {
    auto* w = cmd->add_option("worker", worker, "worker id");
    auto* i = cmd->add_option("--instance", instance, "a whole model instance instead of a worker")
                  ->check(CLI::NonNegativeNumber);
    w->excludes(i);
    cmd->require_option(1);
  }
  auto* get_map = app.add_subcommand(
      "get-expert-map", "print the expert map (JSON, naming its instance for set-expert-map)");
  uint32_t map_instance = 0;
  get_map->add_option("--instance", map_instance, "the model instance (0 = the first)")
      ->capture_default_str();
  auto* set_map = app.add_subcommand("set-expert-map", "apply an edited expert map (JSON FILE)");
  set_map->add_option("file", file, "the map, as get-expert-map prints it, version + 1")
      ->required();
  flotilla::AddConfigFlag(app);
  if (std::optional<int> exit_code = flotilla::ParseCommandLine(app, argc, argv)) return *exit_code;

  auto connection = Connection::Create(conn);
  if (!connection.ok()) {
    std::cerr << "flotillactl: " << connection.status().message() << "\n";
    return 2;
  }
  Connection& c = **connection;
  if (*status) return flotilla::ctl::RunStatus(c, out);
  if (*experts_cmd) {
    if (experts_cmd->count("--watch") > 0 && experts.watch_s <= 0) experts.watch_s = 2;
    return flotilla::ctl::RunExperts(c, experts, out);
  }
  if (*rebalance_cmd) return flotilla::ctl::RunRebalance(c, rebalance, out);
  if (*drain) return flotilla::ctl::RunDrain(c, worker, instance, true, out);
  if (*undrain) return flotilla::ctl::RunDrain(c, worker, instance, false, out);
  if (*get_map) return flotilla::ctl::RunGetExpertMap(c, map_instance, out);
  if (*set_map) return flotilla::ctl::RunSetExpertMap(c, file, out);
  return 2;
}
