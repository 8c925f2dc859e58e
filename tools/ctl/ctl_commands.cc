#include "tools/ctl/ctl_commands.h"

#include <google/protobuf/util/json_util.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "tools/ctl/ctl_format.h"

namespace flotilla::ctl {
namespace {

int Failed(const char* what, const grpc::Status& st) {
  std::cerr << "flotillactl " << what << ": " << st.error_message() << " (code "
            << static_cast<int>(st.error_code()) << ")\n";
  return 1;
}

}  // namespace

int RunStatus(Connection& c, const OutputOptions& out) {
  admin::ClusterStatus status;
  grpc::Status st = c.admin().GetStatus(c.Context().get(), admin::GetStatusRequest(), &status);
  if (!st.ok()) return Failed("status", st);
  admin::PlacementInfo placement;
  const bool placed =
      c.admin().GetPlacement(c.Context().get(), admin::GetPlacementRequest(), &placement).ok();
  if (out.json) {
    std::cout << StatusJson(status, placed ? &placement : nullptr).dump() << "\n";
  } else {
    std::cout << StatusTable(status, placed ? &placement : nullptr);
  }
  return 0;
}

int RunExperts(Connection& c, const ExpertsOptions& o, const OutputOptions& out) {
  admin::ExpertLoadRequest request;
  request.set_layer(o.layer);
  request.set_all_layers(o.layer < 0);
  request.set_window_seconds(o.window_s);
  request.set_instance(o.instance);
  for (int shown = 0;; ++shown) {
    admin::ExpertLoadReport report;
    grpc::Status st = c.admin().GetExpertLoad(c.Context().get(), request, &report);
    if (!st.ok()) return Failed("experts", st);
    if (out.json) {
      std::cout << ExpertLoadJson(report).dump() << std::endl;
    } else {
      if (o.watch_s > 0) std::cout << "\x1b[2J\x1b[H";  // a refreshing screen
      std::cout << ExpertLoadTable(report) << std::flush;
    }
    if (o.watch_s <= 0 || (o.watch_count > 0 && shown + 1 >= o.watch_count)) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(o.watch_s * 1000)));
  }
}

int RunRebalance(Connection& c, const RebalanceOptions& o, const OutputOptions& out) {
  admin::RebalanceRequest request;
  request.set_dry_run(o.dry_run);
  request.set_max_bytes(o.max_bytes);
  request.set_window_seconds(o.window_s);
  request.set_instance(o.instance);
  admin::RebalanceResult result;
  grpc::Status st = c.admin().Rebalance(c.Context().get(), request, &result);
  if (!st.ok()) return Failed("rebalance", st);
  if (out.json) {
    std::cout << RebalanceJson(result).dump() << "\n";
  } else {
    std::cout << RebalanceText(result);
  }
  return 0;
}

int RunDrain(Connection& c, const std::string& worker, int instance, bool drain,
             const OutputOptions& out) {
  admin::DrainRequest request;
  request.set_worker_id(worker);
  if (instance >= 0) request.set_instance(static_cast<uint32_t>(instance));
  admin::DrainResult result;
  grpc::Status st = drain ? c.admin().Drain(c.Context().get(), request, &result)
                          : c.admin().Undrain(c.Context().get(), request, &result);
  if (!st.ok()) return Failed(drain ? "drain" : "undrain", st);
  if (out.json) {
    std::cout << DrainJson(result).dump() << "\n";
  } else if (instance >= 0) {
    std::cout << "instance " << result.instance() << " "
              << (result.drained() ? "drained: no new requests, its requests move to other "
                                     "instances where one serves; "
                                   : "admits requests again; ")
              << result.requests_in_flight() << " in flight\n";
  } else {
    std::cout << "DP group " << result.dp_group() << " (worker " << result.worker_id()
              << ", instance " << result.instance() << ") "
              << (result.drained() ? "drained: no new requests; " : "admits requests again; ")
              << result.requests_in_flight() << " in flight\n";
  }
  return 0;
}

int RunGetExpertMap(Connection& c, uint32_t instance, const OutputOptions& out) {
  cluster::ExpertMap map;
  admin::GetExpertMapRequest req;
  req.set_instance(instance);
  grpc::Status st = c.admin().GetExpertMap(c.Context().get(), req, &map);
  if (!st.ok()) return Failed("get-expert-map", st);
  (void)out;  // the map is JSON either way: what set-expert-map reads back
  std::cout << ProtoJson(map) << "\n";
  return 0;
}

int RunSetExpertMap(Connection& c, const std::string& file, const OutputOptions& out) {
  std::ifstream in(file);
  if (!in) {
    std::cerr << "flotillactl set-expert-map: cannot read " << file << "\n";
    return 2;
  }
  std::stringstream text;
  text << in.rdbuf();
  cluster::ExpertMap map;
  if (auto parsed = google::protobuf::util::JsonStringToMessage(text.str(), &map); !parsed.ok()) {
    std::cerr << "flotillactl set-expert-map: " << file
              << " is not an expert map: " << parsed.message() << "\n";
    return 2;
  }
  cluster::ExpertMap applied;
  grpc::Status st = c.admin().SetExpertMap(c.Context().get(), map, &applied);
  if (!st.ok()) return Failed("set-expert-map", st);
  if (out.json) {
    std::cout << ProtoJson(applied) << "\n";
  } else {
    std::cout << "expert map version " << applied.version() << " applied\n";
  }
  return 0;
}

}  // namespace flotilla::ctl
